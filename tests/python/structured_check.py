"""Structured output and tool calling through the official OpenAI client (run by the gateway's tests).

Usage: structured_check.py BASE_URL API_KEY MODEL [RUNS]

RUNS (default 20) is how many sampled json_schema requests to make. The model behind the gateway
is tiny, so the *content* is nonsense-ish; what is checked is what the server guarantees: every
structured answer parses and validates against its schema, tool calls are well formed, bad
schemas are refused with a 400 that names the problem.

Prints ONE JSON object on stdout with what each call returned (see the report in the keys below);
the Rust test asserts on it. Every hard failure is also listed under "failures" and on stderr,
and the script then exits 1; it exits 2 when the gateway cannot be reached at all.
"""
import enum
import json
import sys
from typing import Literal, Optional

import jsonschema
import openai
from checks import check, failures, out, reach, section
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field, ValidationError

base, key, model = sys.argv[1:4]
RUNS = int(sys.argv[4]) if len(sys.argv) > 4 else 20
c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
out.update({"sdk": openai.__version__})




def schema_errors(instance, schema):
    """None when instance validates against schema, else the first error's message."""
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    return None if err is None else f"{'/'.join(map(str, err.absolute_path))}: {err.message}"


def parse_and_validate(text, schema):
    """(value or None, error or None) for a text that must be JSON valid against schema."""
    try:
        value = json.loads(text or "")
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e}"
    return value, schema_errors(value, schema)


# --- preflight: fail fast and clearly when the gateway is not there --------------------------
reach(base, key, "structured_check")


# --- a nested pydantic model: list of sub-objects, enum, Literal, Optional, bounded number ----
class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str = Field(max_length=40)
    country: str = Field(max_length=40)


class Item(BaseModel):
    name: str = Field(max_length=40)
    quantity: int = Field(ge=1, le=9)


class Order(BaseModel):
    customer: str = Field(max_length=40)
    color: Color
    size: Literal["S", "M", "L"]
    priority: float = Field(ge=0, le=100)
    note: Optional[str] = Field(default=None, max_length=40)
    address: Address
    items: list[Item] = Field(min_length=1, max_length=3)


ORDER_SCHEMA = to_strict_json_schema(Order)  # exactly what parse() sends
jsonschema.Draft202012Validator.check_schema(ORDER_SCHEMA)
ORDER_MESSAGES = [
    {"role": "system", "content": "You turn shop orders into structured data."},
    {"role": "user", "content": "Alice from Lyon, France wants two red T-shirts in size M and one mug. "
                                "Priority 40. Gift wrap please."},
]


def parsed_result(completion):
    m = completion.choices[0].message
    value, err = parse_and_validate(m.content, ORDER_SCHEMA)
    try:
        Order.model_validate_json(m.content or "")
    except ValidationError as e:
        err = err or f"pydantic: {e}"
    return {"content": m.content, "finish": completion.choices[0].finish_reason,
            "parsed": m.parsed.model_dump(mode="json") if m.parsed is not None else None,
            "refusal": m.refusal, "valid": err is None, "error": err,
            "completion_tokens": completion.usage.completion_tokens if completion.usage else None}


@section("parse")
def _(res):
    """chat.completions.parse(response_format=Order), greedy."""
    try:
        r = c.chat.completions.parse(model=model, messages=ORDER_MESSAGES, response_format=Order,
                                     temperature=0, max_tokens=300)
    except openai.LengthFinishReasonError as e:  # the SDK refuses to parse a cut-off answer
        failures.append("parse: finish_reason length (the JSON did not close within max_tokens)")
        return {"finish": "length", "content": e.completion.choices[0].message.content, "valid": False}
    res = parsed_result(r)
    check(res["valid"], f"parse: answer does not validate: {res['error']}: {res['content']!r}")
    check(res["parsed"] is not None, "parse: message.parsed is None")
    check(res["finish"] == "stop", f"parse: finish_reason {res['finish']!r}, want stop")
    return res


@section("parse_stream")
def _(res):
    """chat.completions.stream(response_format=Order): the final parsed completion."""
    deltas = 0
    try:
        with c.chat.completions.stream(model=model, messages=ORDER_MESSAGES, response_format=Order,
                                       temperature=0, max_tokens=300) as s:
            for ev in s:
                if ev.type == "content.delta":
                    deltas += 1
            final = s.get_final_completion()
    except openai.LengthFinishReasonError as e:
        failures.append("parse_stream: finish_reason length (the JSON did not close within max_tokens)")
        return {"finish": "length", "content": e.completion.choices[0].message.content, "valid": False}
    res = parsed_result(final)
    res["deltas"] = deltas
    res["same_as_parse"] = res["content"] == (out.get("parse") or {}).get("content")
    check(res["valid"], f"parse_stream: answer does not validate: {res['error']}: {res['content']!r}")
    check(res["parsed"] is not None, "parse_stream: message.parsed is None")
    check(res["finish"] == "stop", f"parse_stream: finish_reason {res['finish']!r}, want stop")
    check(deltas >= 2, f"parse_stream: only {deltas} content deltas")
    return res


@section("json_object")
def _(res):
    r = c.chat.completions.create(model=model, response_format={"type": "json_object"}, temperature=0,
                                  max_tokens=300, messages=[
        {"role": "system", "content": 'Reply with a JSON object only, like {"city": "Paris", "country": "France"}.'},
        {"role": "user", "content": "Which city and country is the Colosseum in?"}])
    ch = r.choices[0]
    try:
        value = json.loads(ch.message.content or "")
        err = None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
    except json.JSONDecodeError as e:
        value, err = None, f"not JSON: {e}"
    check(err is None, f"json_object: {err} (finish {ch.finish_reason}): {ch.message.content!r}")
    check(ch.finish_reason == "stop", f"json_object: finish_reason {ch.finish_reason!r}, want stop")
    return {"content": ch.message.content, "finish": ch.finish_reason, "is_dict": err is None, "error": err}


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
        "email": {"type": ["string", "null"], "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        "home": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                  "floor": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["zip", "floor"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "active", "email", "tags", "home"],
    "additionalProperties": False,
}
jsonschema.Draft202012Validator.check_schema(PERSON_SCHEMA)
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}


@section("json_schema_runs")
def _(res):
    """RUNS sampled (temperature 1.0) requests with a raw strict json_schema, one seed each."""
    runs = res["runs"] = []
    for seed in range(RUNS):
        try:
            r = c.chat.completions.create(model=model, response_format=PERSON_FORMAT, temperature=1.0, seed=seed,
                                          max_tokens=300, messages=[
                {"role": "user", "content": "Make up a user account for a small wiki."}])
        except Exception as e:  # noqa: BLE001 - one failed request is recorded, the others still run
            runs.append({"seed": seed, "finish": None, "valid": False, "error": f"{type(e).__name__}: {e}",
                         "content": None, "completion_tokens": None})
            check(False, f"json_schema_runs: seed {seed}: raised {type(e).__name__}: {e}")
            continue
        ch = r.choices[0]
        _, err = parse_and_validate(ch.message.content, PERSON_SCHEMA)
        runs.append({"seed": seed, "finish": ch.finish_reason, "valid": err is None, "error": err,
                     "content": ch.message.content,
                     "completion_tokens": r.usage.completion_tokens if r.usage else None})
        check(err is None, f"json_schema_runs: seed {seed}: {err} (finish {ch.finish_reason}): {ch.message.content!r}")
    return {"n": len(runs), "valid": sum(x["valid"] for x in runs),
            "stop": sum(x["finish"] == "stop" for x in runs),
            "distinct": len({x["content"] for x in runs if x["content"] is not None})}


@section("legacy_completion")
def _(res):
    """/v1/completions with response_format (not in the SDK's signature: sent through extra_body)."""
    r = c.completions.create(model=model, prompt='A JSON object describing a cat, with "name" and "age":\n',
                             max_tokens=300, temperature=0, extra_body={"response_format": {"type": "json_object"}})
    ch = r.choices[0]
    try:
        value = json.loads(ch.text)
        err = None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
    except json.JSONDecodeError as e:
        err = f"not JSON: {e}"
    res["json_object"] = {"text": ch.text, "finish": ch.finish_reason, "is_dict": err is None, "error": err}
    check(err is None, f"legacy_completion json_object: {err} (finish {ch.finish_reason}): {ch.text!r}")
    r = c.completions.create(model=model, prompt="A user account for a small wiki, as JSON:\n", max_tokens=300,
                             temperature=0, extra_body={"response_format": PERSON_FORMAT})
    ch = r.choices[0]
    _, err = parse_and_validate(ch.text, PERSON_SCHEMA)
    res["json_schema"] = {"text": ch.text, "finish": ch.finish_reason, "valid": err is None, "error": err}
    check(err is None, f"legacy_completion json_schema: {err} (finish {ch.finish_reason}): {ch.text!r}")
    return res


# --- tools ------------------------------------------------------------------------------------
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {  # deliberately not strict, the way most users write tools
    "type": "object",
    "properties": {"timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris"}},
    "required": ["timezone"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                      "parameters": WEATHER_PARAMS, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "description": "Current local time in a time zone.",
                                      "parameters": TIME_PARAMS}},
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Use the tools to answer."},
    {"role": "user", "content": "What is the weather in Paris in celsius, and what time is it in Europe/Paris?"},
]
FAKE_RESULTS = {"get_weather": '{"temperature": 18, "unit": "celsius", "sky": "cloudy"}',
                "get_time": '{"time": "14:05", "timezone": "Europe/Paris"}'}


def calls_of(tool_calls, what):
    """Describes each tool call and checks it: known name, id, arguments valid for that tool."""
    calls = []
    for tc in tool_calls or []:
        name, args = tc["name"], tc["arguments"]
        if name in PARAMS:
            _, err = parse_and_validate(args, PARAMS[name])
        else:
            err = f"unknown function {name!r}"
        calls.append({"id": tc["id"], "type": tc.get("type"), "name": name, "arguments": args,
                      "valid": err is None, "error": err})
        check(err is None, f"{what}: call {name!r}: {err}: {args!r}")
        check(bool(tc["id"]), f"{what}: call {name!r} has no id")
    return calls


def sdk_calls(message):
    return [{"id": tc.id, "type": tc.type, "name": tc.function.name, "arguments": tc.function.arguments}
            for tc in message.tool_calls or []]


@section("tools_required")
def _(res):
    """Step 1 of the loop: tool_choice required, parallel calls allowed."""
    r = c.chat.completions.create(model=model, messages=TOOL_MESSAGES, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=True, temperature=0, max_tokens=300)
    ch = r.choices[0]
    calls = calls_of(sdk_calls(ch.message), "tools_required")
    ids = [x["id"] for x in calls]
    res.update({"finish": ch.finish_reason, "content": ch.message.content, "calls": calls, "n_calls": len(calls),
                "ids_distinct": len(set(ids)) == len(ids), "role": ch.message.role,
                "message": ch.message.model_dump(mode="json", exclude_unset=True)})
    check(len(calls) >= 1, "tools_required: no tool_calls")
    check(res["ids_distinct"], f"tools_required: ids not distinct: {ids}")
    check(ch.finish_reason == "tool_calls", f"tools_required: finish_reason {ch.finish_reason!r}, want tool_calls")
    # Step 2: the assistant message as returned (the SDK object, as users append it), one tool
    # result per call, then ask again.
    history = TOOL_MESSAGES + [ch.message] + [
        {"role": "tool", "tool_call_id": tc.id, "content": FAKE_RESULTS.get(tc.function.name, '{"ok": true}')}
        for tc in ch.message.tool_calls or []]
    for choice in ["none", "auto"]:
        r2 = c.chat.completions.create(model=model, messages=history, tools=TOOLS, tool_choice=choice,
                                       temperature=0, max_tokens=120)
        ch2 = r2.choices[0]
        calls2 = sdk_calls(ch2.message)
        step = {"finish": ch2.finish_reason, "content": ch2.message.content, "kind": "tool_calls" if calls2 else "text"}
        if calls2:  # only "auto" may call again; then it must be well formed
            step["calls"] = calls_of(calls2, f"tools_required then_{choice}")
            check(choice == "auto", f"tools_required then_{choice}: tool_choice none but got tool_calls {calls2}")
            check(ch2.finish_reason == "tool_calls",
                  f"tools_required then_{choice}: calls but finish_reason {ch2.finish_reason!r}")
        else:
            check(bool((ch2.message.content or "").strip()), f"tools_required then_{choice}: empty answer")
            check(ch2.finish_reason in ("stop", "length"),
                  f"tools_required then_{choice}: finish_reason {ch2.finish_reason!r}, want stop or length")
        res[f"then_{choice}"] = step


@section("tools_named")
def _(res):
    """tool_choice naming get_time: exactly that function, once."""
    r = c.chat.completions.create(model=model, messages=TOOL_MESSAGES, tools=TOOLS, temperature=0, max_tokens=300,
                                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    ch = r.choices[0]
    calls = calls_of(sdk_calls(ch.message), "tools_named")
    check(len(calls) == 1, f"tools_named: {len(calls)} calls, want exactly 1")
    check(all(x["name"] == "get_time" for x in calls), f"tools_named: called {[x['name'] for x in calls]}")
    # OpenAI itself answers finish_reason "stop" for a named tool_choice; recorded, not checked.
    return {"finish": ch.finish_reason, "calls": calls, "n_calls": len(calls)}


@section("tools_no_parallel")
def _(res):
    """tool_choice required with parallel_tool_calls false: exactly one call."""
    r = c.chat.completions.create(model=model, messages=TOOL_MESSAGES, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=False, temperature=0, max_tokens=300)
    ch = r.choices[0]
    calls = calls_of(sdk_calls(ch.message), "tools_no_parallel")
    check(len(calls) == 1, f"tools_no_parallel: {len(calls)} calls, want exactly 1")
    check(ch.finish_reason == "tool_calls", f"tools_no_parallel: finish_reason {ch.finish_reason!r}")
    return {"finish": ch.finish_reason, "calls": calls, "n_calls": len(calls)}


@section("tools_stream")
def _(res):
    """A streamed required tool call, assembled from delta.tool_calls by index (the standard way)."""
    acc, finish, chunks, tool_chunks, content, usage = {}, None, 0, 0, [], None
    stream = c.chat.completions.create(model=model, messages=TOOL_MESSAGES, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=300, stream=True,
                                       stream_options={"include_usage": True})
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        for ch in chunk.choices:
            if ch.delta.content:
                content.append(ch.delta.content)
            if ch.delta.tool_calls:
                tool_chunks += 1
            for tc in ch.delta.tool_calls or []:
                e = acc.setdefault(tc.index, {"id": None, "type": None, "name": "", "arguments": ""})
                e["id"] = tc.id or e["id"]
                e["type"] = tc.type or e["type"]
                if tc.function and tc.function.name:
                    e["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    e["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    calls = calls_of([acc[i] for i in sorted(acc)], "tools_stream")
    ids = [x["id"] for x in calls]
    check(len(calls) >= 1, "tools_stream: no tool_calls deltas")
    check(len(set(ids)) == len(ids), f"tools_stream: ids not distinct: {ids}")
    check(finish == "tool_calls", f"tools_stream: last finish_reason {finish!r}, want tool_calls")
    same = [(x["name"], x["arguments"]) for x in calls] == \
        [(x["name"], x["arguments"]) for x in (out.get("tools_required") or {}).get("calls", [])]
    return {"finish": finish, "calls": calls, "n_calls": len(calls), "indices": sorted(acc), "chunks": chunks,
            "tool_chunks": tool_chunks, "content": "".join(content), "usage": usage, "same_as_whole": same}


# --- bad input: 400 that names the problem, and the gateway keeps serving ---------------------
def bad_schema(schema):
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema, "strict": True}}}


BAD = [
    # (key, extra arguments to chat.completions.create, a word the error message must contain)
    ("bad_schema_type", bad_schema({"type": "objekt"}), "objekt"),
    ("bad_schema_format", bad_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    ("bad_schema_keyword", bad_schema({"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
     "uniqueItems"),
    ("bad_tool_parameters", {"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "strng"}}}}}],
        "tool_choice": "required"}, "strng"),
    ("unknown_tool_choice", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "no_such_function"}}},
     "no_such_function"),
]


@section("bad")
def _(res):
    for name, extra, word in BAD:
        try:
            r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                          **extra)
            res[name] = {"class": None, "status": 200, "message": None, "names_problem": False,
                         "content": r.choices[0].message.content}
            check(False, f"{name}: accepted (200), want a 400 naming {word!r}")
            continue
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            msg = body.get("message") if isinstance(body.get("message"), str) else str(e)
            res[name] = {"class": type(e).__name__, "status": e.status_code, "message": msg,
                         "code": body.get("code"), "param": body.get("param"), "type": body.get("type"),
                         "names_problem": word.lower() in msg.lower()}
        except Exception as e:  # noqa: BLE001 - e.g. the connection dropped: record it, try the next
            res[name] = {"class": type(e).__name__, "status": None, "message": str(e), "names_problem": False}
        check(res[name]["class"] == "BadRequestError" and res[name]["status"] == 400,
              f"{name}: {res[name]['class']} {res[name]['status']}, want BadRequestError 400: {res[name]['message']}")
        check(res[name]["names_problem"], f"{name}: the message does not name {word!r}: {res[name]['message']!r}")
    return res


@section("after_bad")
def _(res):
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12)
    ch = r.choices[0]
    check(bool((ch.message.content or "").strip()), "after_bad: empty answer")
    return {"content": ch.message.content, "finish": ch.finish_reason}


out["failures"] = failures
print(json.dumps(out))
if failures:
    print("structured_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
