use super::*;

fn req(body: Value) -> Result<GenerateRequest, AnthropicError> {
    serde_json::from_value::<MessagesRequest>(body).unwrap().to_request()
}

fn refused(body: Value) -> (String, Value) {
    match req(body) {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => (e.0.param.clone().unwrap_or_default(), e.body()),
    }
}

#[test]
fn a_tool_loop_becomes_the_chat_it_means() {
    let r = req(json!({
        "model": "m", "max_tokens": 32000,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "no data"}]},
                {"type": "text", "text": "Thanks."}]}],
        "tools": [{"name": "weather", "description": "Weather now",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}, "stop_sequences": ["END"],
        "temperature": 0
    }))
    .unwrap_or_else(|e| panic!("{}", e.body()));
    let m = r.messages.as_ref().unwrap();
    let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool", "user"]);
    assert_eq!(m[0].content, "Be brief.");
    assert_eq!(m[2].content, "Checking.");
    assert_eq!(m[2].tool_calls.len(), 2);
    assert_eq!(m[2].tool_calls[1].id, "toolu_2");
    assert_eq!(m[2].tool_calls[1].arguments, r#"{"city":"Rome"}"#);
    assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(m[4].content, "Error: no data");
    assert_eq!(m[5].content, "Thanks.");
    assert_eq!(r.tools[0].name, "weather");
    assert_eq!(r.tool_choice, ToolChoice::Auto);
    assert!(!r.parallel_tool_calls);
    assert_eq!(r.config.stop, ["END"]);
    assert_eq!(r.config.temperature, 0.0);
    assert_eq!((r.config.max_tokens, r.config.fit_max_tokens), (32000, true));
}

#[test]
fn tool_choice_any_and_tool_force_calls() {
    let base = |choice: Value| {
        json!({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": choice})
    };
    assert_eq!(
        req(base(json!({"type": "any"}))).ok().unwrap().tool_choice,
        ToolChoice::Required
    );
    assert_eq!(
        req(base(json!({"type": "tool", "name": "f"})))
            .ok()
            .unwrap()
            .tool_choice,
        ToolChoice::Function { name: "f".into() }
    );
    assert_eq!(
        req(base(json!({"type": "none"}))).ok().unwrap().tool_choice,
        ToolChoice::None
    );
    assert_eq!(
        refused(base(json!({"type": "tool", "name": "g"}))).0,
        "tool_choice.name"
    );
    assert_eq!(refused(base(json!({"type": "maybe"}))).0, "tool_choice.type");
}

#[test]
fn what_cannot_be_honoured_is_refused_in_anthropics_shape() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let (param, body) = refused(json!({"messages": user}));
    assert_eq!(param, "max_tokens");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens: is required"));
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": user, "frobnicate": 1})).0,
        "frobnicate"
    );
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})).0,
        "messages[0].role"
    );
    assert_eq!(refused(json!({"max_tokens": 5, "messages": []})).0, "messages");
    let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": image})).0,
        "messages[0].content[0].type"
    );
    let prefill = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]);
    assert_eq!(refused(json!({"max_tokens": 5, "messages": prefill})).0, "messages");
    let server_tool = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": user, "tools": server_tool})).0,
        "tools[0].type"
    );
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": user, "temperature": 1.5})).0,
        "temperature"
    );
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": user, "thinking": {"type": "sometimes"}})).0,
        "thinking.type"
    );
    let stray = json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]);
    assert_eq!(
        refused(json!({"max_tokens": 5, "messages": stray})).0,
        "messages[0].content[0].type"
    );
}

#[test]
fn error_types_follow_the_status() {
    let e = |status| AnthropicError(ApiError::new(status, "x", "y", "m")).body()["error"]["type"].clone();
    assert_eq!(e(StatusCode::UNAUTHORIZED), "authentication_error");
    assert_eq!(e(StatusCode::FORBIDDEN), "permission_error");
    assert_eq!(e(StatusCode::NOT_FOUND), "not_found_error");
    assert_eq!(e(StatusCode::TOO_MANY_REQUESTS), "rate_limit_error");
    assert_eq!(e(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
    assert_eq!(e(StatusCode::BAD_GATEWAY), "api_error");
}
