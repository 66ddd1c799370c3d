use super::*;

fn chat(body: Value) -> Result<GenerateRequest, OllamaError> {
    let req: ChatRequest = serde_json::from_value(body).unwrap();
    let mut sy = GenerateRequest::chat(
        Client::new_request_id(),
        req.model.clone(),
        conversation(&req.messages)?,
    );
    req.common.apply(&mut sy)?;
    Ok(sy)
}

fn param(r: Result<GenerateRequest, OllamaError>) -> String {
    match r {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => e.0.param.unwrap_or_default(),
    }
}

#[test]
fn options_and_a_tool_turn_become_the_request_they_mean() {
    let r = chat(json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather in Paris and the time?"},
            {"role": "assistant", "content": "", "thinking": "two calls", "tool_calls": [
                {"function": {"name": "get_time", "arguments": {"tz": "CET"}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
            {"role": "tool", "content": "14:05"}],
        "format": "json",
        "options": {"temperature": 0, "num_predict": 50, "stop": ["\n\n"], "seed": 7, "num_ctx": 8192,
                    "repeat_penalty": 1.1, "mirostat": 0, "top_k": 10},
        "keep_alive": "5m", "think": false, "stream": false
    }))
    .unwrap_or_else(|e| panic!("{}", e.0.message));
    let m = r.messages.as_ref().unwrap();
    assert_eq!(m[1].tool_calls.len(), 2);
    assert_eq!(m[1].tool_calls[1].arguments, r#"{"city":"Paris"}"#);
    // The tool turns answer the calls by name, then in order.
    assert_eq!(m[2].tool_call_id.as_deref(), Some(m[1].tool_calls[1].id.as_str()));
    assert_eq!(m[3].tool_call_id.as_deref(), Some(m[1].tool_calls[0].id.as_str()));
    let c = &r.config;
    assert_eq!(
        (c.temperature, c.top_k, c.max_tokens, c.fit_max_tokens),
        (0.0, 10, 50, false)
    );
    assert_eq!((c.stop.as_slice(), c.seed), (["\n\n".to_string()].as_slice(), Some(7)));
    assert_eq!(c.constraint, Some(Constraint::JsonObject));
}

#[test]
fn without_num_predict_an_answer_runs_until_the_model_stops() {
    let r = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .ok()
        .unwrap();
    assert_eq!((r.config.max_tokens, r.config.fit_max_tokens), (UNBOUNDED_TOKENS, true));
    let r = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "options": {"num_predict": -1}, "format": {"type": "object"}}))
    .ok()
    .unwrap();
    assert!(r.config.fit_max_tokens);
    assert!(matches!(r.config.constraint, Some(Constraint::JsonSchema { .. })));
}

#[test]
fn what_cannot_be_honoured_is_refused() {
    let hi = json!([{"role": "user", "content": "hi"}]);
    assert_eq!(param(chat(json!({"model": "m", "messages": hi, "frob": 1}))), "frob");
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi, "options": {"mirostat": 2}}))),
        "options.mirostat"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi, "options": {"warp": 9}}))),
        "options.warp"
    );
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi, "format": "yaml"}))),
        "format"
    );
    let image = json!([{"role": "user", "content": "what is this", "images": ["aGk="]}]);
    assert_eq!(
        param(chat(json!({"model": "m", "messages": image}))),
        "messages[0].images"
    );
    let role = json!([{"role": "narrator", "content": "x"}]);
    assert_eq!(param(chat(json!({"model": "m", "messages": role}))), "messages[0].role");
    assert_eq!(
        param(chat(json!({"model": "m", "messages": hi, "think": "maximal"}))),
        "think"
    );
}

#[test]
fn timestamps_are_rfc3339_in_utc() {
    let t = answer::timestamp();
    assert_eq!(t.len(), "2026-12-07T22:10:22.123456789Z".len(), "{t}");
    assert!(t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T", "{t}");
}
