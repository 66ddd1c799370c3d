"""OpenAI's Responses API through the official `openai` client (run by tests/responses_api.rs).

Usage: responses_check.py BASE_URL_A BASE_URL_B API_KEY MODEL

Two gateways of one fleet (one NATS cluster with JetStream): a conversation started on A is continued
on B with previous_response_id. The model is tiny, so the content is nonsense-ish; what is checked is
what the server guarantees: the shapes the SDK parses (whole and streamed), greedy answers equal whole
and streamed, function calls forced and named whose arguments match their schemas, a tool output sent
back, text.format, the stored chain, GET / DELETE / input_items, errors.

Prints ONE JSON object on stdout; hard failures are listed under "failures" (and the script exits 1).
"""
import json
import sys

import openai
from checks import check, failures, out, section

base_a, base_b, key, model = sys.argv[1:5]
a = openai.OpenAI(base_url=base_a, api_key=key, max_retries=0, timeout=120)
b = openai.OpenAI(base_url=base_b, api_key=key, max_retries=0, timeout=120)
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                    "required": ["city"], "additionalProperties": False}},
    {"type": "function", "name": "get_time", "description": "The time in a timezone.",
     "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                    "required": ["tz"], "additionalProperties": False}},
]


@section("create")
def _(res):
    r = a.responses.create(model=model, instructions="You are terse.", input="Name three colors.",
                           temperature=0, max_output_tokens=24)
    res.update({"id": r.id, "object": r.object, "status": r.status, "text": r.output_text, "model": r.model,
                "input_tokens": r.usage.input_tokens, "output_tokens": r.usage.output_tokens,
                "incomplete": r.incomplete_details.reason if r.incomplete_details else None})
    check(r.id.startswith("resp_") and r.object == "response", "create: a response")
    check(r.status in ("completed", "incomplete"), f"create: status {r.status}")
    check(r.output_text, "create: some text")


@section("stream")
def _(res):
    kinds, deltas = [], []
    with a.responses.stream(model=model, instructions="You are terse.", input="Name three colors.",
                            temperature=0, max_output_tokens=200) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        final = s.get_final_response()
    res.update({"first": kinds[:2], "last": kinds[-1], "deltas": len(deltas), "text": "".join(deltas),
                "final_text": final.output_text, "status": final.status})
    check(kinds[:2] == ["response.created", "response.in_progress"], f"stream: begins {kinds[:2]}")
    check(kinds[-1] == "response.completed", f"stream: ends {kinds[-1]}")
    check(res["text"] == final.output_text, "stream: deltas add up to the final text")
    check(final.output_text.startswith(out["create"]["text"]), "stream: greedy streamed continues greedy whole")


@section("chain")
def _(res):
    first = a.responses.create(model=model, input="My name is Ada. Remember it.", temperature=0,
                               max_output_tokens=16)
    second = b.responses.create(model=model, previous_response_id=first.id, input="What is my name?",
                                temperature=0, max_output_tokens=16)
    items = b.responses.input_items.list(second.id)
    got = a.responses.retrieve(second.id)
    res.update({"first": first.id, "second": second.id, "second_prev": second.previous_response_id,
                "second_input_tokens": second.usage.input_tokens, "first_input_tokens": first.usage.input_tokens,
                "second_cached": second.usage.input_tokens_details.cached_tokens,
                "retrieved_same": got.output_text == second.output_text, "input_items": len(items.data)})
    check(second.previous_response_id == first.id, "chain: previous_response_id echoed")
    check(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
          "chain: the second prompt holds the first turn")
    check(res["retrieved_same"], "chain: gateway A retrieves what gateway B stored")
    deleted = a.responses.delete(first.id)
    res["deleted"] = deleted is None or getattr(deleted, "deleted", True)
    try:
        b.responses.create(model=model, previous_response_id=first.id, input="And now?", max_output_tokens=8)
        res["after_delete"] = None
    except openai.NotFoundError as e:
        res["after_delete"] = e.status_code
    check(res["after_delete"] == 404, "chain: a deleted response cannot be continued")


@section("tools")
def _(res):
    r = a.responses.create(model=model, input="Weather in Paris and the time in CET?", tools=TOOLS,
                           tool_choice="required", temperature=0, max_output_tokens=300)
    calls = [o for o in r.output if o.type == "function_call"]
    res["calls"] = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
    check(len(calls) >= 1, "tools: at least one call")
    for c in res["calls"]:
        if c["name"] == "get_time":
            check(c["arguments"].get("tz") in ("UTC", "CET"), f"tools: tz in its enum {c}")
        else:
            check(isinstance(c["arguments"].get("city"), str), f"tools: city a string {c}")
    outputs = [{"type": "function_call_output", "call_id": c.call_id,
                "output": "sunny" if c.name == "get_weather" else "14:05"} for c in calls]
    r2 = b.responses.create(model=model, previous_response_id=r.id, input=outputs, tools=TOOLS,
                            temperature=0, max_output_tokens=24)
    res["after_outputs"] = {"status": r2.status, "text": r2.output_text}
    check(r2.status in ("completed", "incomplete"), "tools: answered after the outputs")
    named = a.responses.create(model=model, input="Time?", tools=TOOLS, parallel_tool_calls=False,
                               tool_choice={"type": "function", "name": "get_time"}, temperature=0,
                               max_output_tokens=100)
    res["named"] = [o.name for o in named.output if o.type == "function_call"]
    check(res["named"] == ["get_time"], f"tools: the named function once: {res['named']}")
    kinds = []
    with a.responses.stream(model=model, input="Weather in Rome?", tools=TOOLS,
                            tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                            max_output_tokens=100) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    res["streamed"] = {"events": sorted(set(kinds)), "calls": [(c.name, c.arguments) for c in streamed]}
    check("response.function_call_arguments.done" in kinds, "tools: streamed argument events")
    check(len(streamed) == 1 and json.loads(streamed[0].arguments).get("city"), "tools: the streamed call")


@section("format")
def _(res):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    r = a.responses.create(model=model, input="A color?", temperature=0, max_output_tokens=40,
                           text={"format": {"type": "json_schema", "name": "color", "schema": schema,
                                            "strict": True}})
    res["text"] = r.output_text
    try:
        res["valid"] = json.loads(r.output_text).get("color") in ("red", "green", "blue")
    except json.JSONDecodeError:
        res["valid"] = False
    check(res["valid"], f"format: {r.output_text!r}")


def error(fn):
    try:
        fn()
        return {"class": None}
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "message": str(e)}


@section("errors")
def _(res):
    res["unknown_previous"] = error(lambda: a.responses.create(model=model, input="hi",
                                                               previous_response_id="resp_nosuchthing"))
    res["hosted_tool"] = error(lambda: a.responses.create(model=model, input="hi",
                                                          tools=[{"type": "web_search"}]))
    res["unknown_field"] = error(lambda: a.responses.create(model=model, input="hi",
                                                            extra_body={"frobnicate": 1}))
    res["get_unknown"] = error(lambda: a.responses.retrieve("resp_nosuchthing"))
    res["image"] = error(lambda: a.responses.create(model=model, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]))


out["failures"] = failures
print(json.dumps(out))
if failures:
    print("responses_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
