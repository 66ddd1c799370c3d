"""Anthropic's Messages API through the official `anthropic` client (run by tests/anthropic_api.rs).

Usage: anthropic_check.py BASE_URL API_KEY RESTRICTED_KEY MODEL

BASE_URL is the gateway's root (the SDK adds /v1/messages). The model is tiny, so the content is
nonsense-ish; what is checked is what the server guarantees: the shapes the SDK parses (whole and
streamed), greedy answers equal whole and streamed, a two-tool loop with forced and named calls
whose inputs match their schemas, count_tokens agreeing with usage, and errors in Anthropic's shape
and the SDK's exception classes.

Prints ONE JSON object on stdout; hard failures are listed under "failures" (and the script exits 1).
"""
import json
import sys

import anthropic
from checks import check, failures, out, section

base, key, restricted, model = sys.argv[1:5]
c = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
out["sdk"] = anthropic.__version__

# The 2026 SDK no longer sends sampling knobs; older clients do, and the gateway takes them.
GREEDY = {"extra_body": {"temperature": 0}}
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
ASK = [{"role": "user", "content": "Name three colors."}]
TOOLS = [
    {"name": "get_weather", "description": "The weather in a city now.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}},
    {"name": "get_time", "description": "The time in a timezone.",
     "input_schema": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                      "required": ["tz"], "additionalProperties": False}},
]


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


@section("create")
def _(res):
    m = c.messages.create(model=model, max_tokens=24, system=SYSTEM, messages=ASK,
                          metadata={"user_id": "checker"}, **GREEDY)
    res.update({"type": m.type, "role": m.role, "model": m.model, "id": m.id, "text": text_of(m),
                "stop_reason": m.stop_reason, "input_tokens": m.usage.input_tokens,
                "cache_read": m.usage.cache_read_input_tokens, "output_tokens": m.usage.output_tokens})
    check(m.type == "message" and m.role == "assistant", "create: a message from the assistant")
    check(m.id.startswith("msg_"), "create: a msg_ id")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"create: stop_reason {m.stop_reason}")
    check(m.usage.output_tokens >= 1, "create: output tokens counted")


@section("stream")
def _(res):
    events, texts = [], []
    with c.messages.stream(model=model, max_tokens=24, system=SYSTEM, messages=ASK, **GREEDY) as s:
        for ev in s:
            events.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                texts.append(ev.delta.text)
        final = s.get_final_message()
    res.update({"events": sorted(set(events)), "first": events[0], "last": events[-1], "deltas": len(texts),
                "text": "".join(texts), "final_text": text_of(final), "stop_reason": final.stop_reason,
                "output_tokens": final.usage.output_tokens, "input_tokens": final.usage.input_tokens,
                "cache_read": final.usage.cache_read_input_tokens})
    check(events[0] == "message_start" and events[-1] == "message_stop", f"stream: framing {events[:2]}..{events[-2:]}")
    check(res["text"] == res["final_text"], "stream: deltas add up to the final message")
    check(res["text"] == out["create"].get("text"), "stream: greedy streamed == greedy whole")


@section("stop_sequence")
def _(res):
    # Stop at the first space the answer writes: the answer is the text before it, and the
    # message says which stop sequence ended it (whole and streamed).
    full = c.messages.create(model=model, max_tokens=24, messages=ASK, **GREEDY)
    m = c.messages.create(model=model, max_tokens=24, messages=ASK, stop_sequences=[" ", "\n"], **GREEDY)
    res.update({"full": text_of(full), "text": text_of(m), "stop_reason": m.stop_reason,
                "stop_sequence": m.stop_sequence})
    check(m.stop_reason == "stop_sequence" and m.stop_sequence in (" ", "\n"),
          f"stop_sequence: {m.stop_reason} {m.stop_sequence!r}")
    check(full.content and text_of(full).startswith(text_of(m) + m.stop_sequence),
          f"stop_sequence: the answer up to the stop ({text_of(full)!r})")
    with c.messages.stream(model=model, max_tokens=24, messages=ASK, stop_sequences=[" ", "\n"], **GREEDY) as s:
        final = s.get_final_message()
    check((final.stop_reason, final.stop_sequence) == (m.stop_reason, m.stop_sequence), "stop_sequence: streamed")


@section("count_tokens")
def _(res):
    n = c.messages.count_tokens(model=model, system=SYSTEM, messages=ASK)
    res["input_tokens"] = n.input_tokens
    total = out["create"]["input_tokens"] + out["create"]["cache_read"]
    check(n.input_tokens == total, f"count_tokens {n.input_tokens} == the request's prompt tokens {total}")


def tool_uses(msg):
    return [b for b in msg.content if b.type == "tool_use"]


@section("tool_loop")
def _(res):
    ask = [{"role": "user", "content": "What is the weather in Paris, and the time in CET?"}]
    m = c.messages.create(model=model, max_tokens=400, messages=ask, tools=TOOLS,
                          tool_choice={"type": "any"}, **GREEDY)
    calls = tool_uses(m)
    res["first"] = {"stop_reason": m.stop_reason, "calls": [{"name": u.name, "input": u.input} for u in calls]}
    check(m.stop_reason == "tool_use", f"tool_loop: forced call stop_reason {m.stop_reason}")
    check(len(calls) >= 1, "tool_loop: at least one tool_use")
    for u in calls:
        check(u.id and u.name in ("get_weather", "get_time"), f"tool_loop: call {u.name}")
        check(isinstance(u.input, dict), "tool_loop: input is an object")
        if u.name == "get_time":
            check(u.input.get("tz") in ("UTC", "CET"), f"tool_loop: tz in its enum: {u.input}")
        if u.name == "get_weather":
            check(isinstance(u.input.get("city"), str), f"tool_loop: city is a string: {u.input}")
    results = [{"type": "tool_result", "tool_use_id": u.id,
                "content": "sunny, 21 C" if u.name == "get_weather" else [{"type": "text", "text": "14:05"}]}
               for u in calls]
    history = ask + [{"role": "assistant", "content": m.content}, {"role": "user", "content": results}]
    m2 = c.messages.create(model=model, max_tokens=24, messages=history, tools=TOOLS, **GREEDY)
    res["second"] = {"stop_reason": m2.stop_reason, "text": text_of(m2), "calls": len(tool_uses(m2))}
    check(m2.stop_reason in ("end_turn", "max_tokens", "tool_use"), "tool_loop: the answer after the results")
    named = c.messages.create(model=model, max_tokens=100, messages=ask, tools=TOOLS,
                              tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
                              **GREEDY)
    res["named"] = [{"name": u.name, "input": u.input} for u in tool_uses(named)]
    check([u["name"] for u in res["named"]] == ["get_time"], f"tool_loop: the named tool, once: {res['named']}")


@section("tool_stream")
def _(res):
    ask = [{"role": "user", "content": "Weather in Rome?"}]
    with c.messages.stream(model=model, max_tokens=200, messages=ask, tools=TOOLS,
                           tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_message()
    uses = tool_uses(final)
    res.update({"stop_reason": final.stop_reason, "calls": [{"name": u.name, "input": u.input} for u in uses],
                "events": kinds.count("content_block_start")})
    check(final.stop_reason == "tool_use", "tool_stream: stop_reason tool_use")
    check(len(uses) == 1 and uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str),
          f"tool_stream: the streamed call's input assembles: {res['calls']}")


@section("output_format")
def _(res):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["color", "count"], "additionalProperties": False}
    m = c.messages.create(model=model, max_tokens=60, messages=ASK,
                          output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    res["text"] = text_of(m)
    try:
        v = json.loads(res["text"])
        ok = v.get("color") in ("red", "green", "blue") and isinstance(v.get("count"), int) and 1 <= v["count"] <= 9
    except (json.JSONDecodeError, AttributeError):
        ok = False
    res["valid"] = ok
    check(ok, f"output_format: the answer follows the schema: {res['text']!r}")


@section("prewarm")
def _(res):
    ask = [{"role": "user", "content": "A prompt warmed before it is asked: tell me about the sea, in one line."}]
    m = c.messages.create(model=model, max_tokens=0, messages=ask)
    res.update({"content": len(m.content), "stop_reason": m.stop_reason, "output_tokens": m.usage.output_tokens})
    check(m.content == [] and m.stop_reason == "max_tokens", f"prewarm: no answer, stop_reason {m.stop_reason}")
    m2 = c.messages.create(model=model, max_tokens=8, messages=ask, **GREEDY)
    res["then_cached"] = m2.usage.cache_read_input_tokens
    check((m2.usage.cache_read_input_tokens or 0) > 0, "prewarm: the next request reads the warmed prompt")


def error(fn):
    try:
        fn()
        return {"class": None}
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__, "status": e.status_code, "type": body.get("type"),
                "error_type": (body.get("error") or {}).get("type"), "message": str(e)}


@section("errors")
def _(res):
    send = lambda **kw: c.messages.create(**{"model": model, "max_tokens": 8, "messages": ASK, **kw})  # noqa: E731
    res["no_key"] = error(lambda: anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
                          .messages.create(model=model, max_tokens=8, messages=ASK))
    res["not_allowed"] = error(lambda: anthropic.Anthropic(base_url=base, api_key=restricted, max_retries=0)
                               .messages.create(model=model, max_tokens=8, messages=ASK))
    res["unknown_model"] = error(lambda: send(model="no-such-model"))
    res["unknown_field"] = error(lambda: send(extra_body={"frobnicate": True}))
    res["bad_role"] = error(lambda: send(messages=[{"role": "system", "content": "hi"}]))
    res["image"] = error(lambda: send(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]))
    res["bad_tool_choice"] = error(lambda: send(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}))
    # And the fleet keeps serving.
    res["after"] = text_of(send(max_tokens=24, system=SYSTEM, **GREEDY)) == out["create"].get("text")
    check(res["after"], "errors: the same greedy answer after the bad requests")


out["failures"] = failures
print(json.dumps(out))
if failures:
    print("anthropic_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
