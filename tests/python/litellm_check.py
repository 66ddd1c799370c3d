"""LiteLLM (as an OpenAI-compatible provider) against a switchyard gateway (run by the gateway's tests).

Usage: litellm_check.py BASE_URL API_KEY MODEL

Prints ONE JSON object on stdout with what each call returned; the Rust test asserts on it.
Every hard failure is also listed under "failures" and on stderr, and the script then exits 1;
it exits 2 when the gateway cannot be reached at all.
"""
import json
import os
import sys
from importlib.metadata import version
from typing import Literal

# LiteLLM fetches its model price map from GitHub on import unless told not to; CI has no
# network beyond the package registries.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

import jsonschema  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
from checks import check, failures, out, reach, section  # noqa: E402
from pydantic import BaseModel, Field, ValidationError  # noqa: E402

base, key, model = sys.argv[1:4]
out.update({"litellm": version("litellm")})
litellm.drop_params = False  # an unsupported parameter must fail loudly, not vanish
litellm.suppress_debug_info = True
COMMON = {"model": f"openai/{model}", "api_base": base, "api_key": key, "temperature": 0, "max_tokens": 300,
          "num_retries": 0, "max_retries": 0, "timeout": 120}




reach(base, key, "litellm_check")


class Ingredient(BaseModel):
    name: str = Field(max_length=30)
    grams: int = Field(ge=1, le=1000)


class Recipe(BaseModel):
    title: str = Field(max_length=40)
    difficulty: Literal["easy", "medium", "hard"]
    minutes: int = Field(ge=1, le=240)
    ingredients: list[Ingredient] = Field(min_length=1, max_length=4)


RECIPE_MESSAGES = [{"role": "user", "content": "Give me a simple pancake recipe."}]

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30},
                   "country": {"type": "string", "maxLength": 30},
                   "population_millions": {"type": "integer", "minimum": 0, "maximum": 50},
                   "capital": {"type": "boolean"}},
    "required": ["city", "country", "population_millions", "capital"],
    "additionalProperties": False,
}


def recipe_of(content):
    try:
        return Recipe.model_validate_json(content or "").model_dump(mode="json"), None
    except ValidationError as e:
        return None, str(e)


@section("pydantic")
def _(res):
    """response_format=<pydantic class>: LiteLLM turns it into a strict json_schema."""
    r = litellm.completion(messages=RECIPE_MESSAGES, response_format=Recipe, **COMMON)
    ch = r.choices[0]
    parsed, err = recipe_of(ch.message.content)
    check(err is None, f"pydantic: {err} (finish {ch.finish_reason}): {ch.message.content!r}")
    check(ch.finish_reason == "stop", f"pydantic: finish_reason {ch.finish_reason!r}, want stop")
    return {"content": ch.message.content, "finish": ch.finish_reason, "parsed": parsed, "valid": err is None,
            "error": err}


@section("pydantic_stream")
def _(res):
    """The same, streamed: the concatenated deltas parse."""
    parts, finish = [], None
    for chunk in litellm.completion(messages=RECIPE_MESSAGES, response_format=Recipe, stream=True, **COMMON):
        for ch in chunk.choices:
            if ch.delta.content:
                parts.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    content = "".join(parts)
    parsed, err = recipe_of(content)
    check(err is None, f"pydantic_stream: {err} (finish {finish}): {content!r}")
    check(finish == "stop", f"pydantic_stream: finish_reason {finish!r}, want stop")
    return {"content": content, "finish": finish, "chunks": len(parts), "parsed": parsed, "valid": err is None,
            "error": err, "same_as_whole": content == (out.get("pydantic") or {}).get("content")}


@section("json_schema")
def _(res):
    """response_format as a raw json_schema dict."""
    r = litellm.completion(messages=[{"role": "user", "content": "Describe a city."}], **COMMON,
                           response_format={"type": "json_schema",
                                            "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}})
    ch = r.choices[0]
    try:
        value = json.loads(ch.message.content or "")
        err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(CITY_SCHEMA).iter_errors(value))
        err = None if err is None else err.message
    except json.JSONDecodeError as e:
        value, err = None, f"not JSON: {e}"
    check(err is None, f"json_schema: {err} (finish {ch.finish_reason}): {ch.message.content!r}")
    return {"content": ch.message.content, "finish": ch.finish_reason, "valid": err is None, "error": err}


WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": PARAMS[n]}}
         for n, d in [("get_weather", "Current weather in a city."), ("get_time", "Current local time in a time zone.")]]


@section("tools_required")
def _(res):
    r = litellm.completion(messages=[{"role": "user", "content": "What is the weather in Paris in celsius?"}],
                           tools=TOOLS, tool_choice="required", **COMMON)
    ch = r.choices[0]
    calls = []
    for tc in ch.message.tool_calls or []:
        name, args = tc.function.name, tc.function.arguments
        try:
            err = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(PARAMS[name]).iter_errors(json.loads(args))) if name in PARAMS \
                else f"unknown function {name!r}"
            err = err if err is None or isinstance(err, str) else err.message
        except json.JSONDecodeError as e:
            err = f"not JSON: {e}"
        calls.append({"id": tc.id, "name": name, "arguments": args, "valid": err is None, "error": err})
        check(err is None, f"tools_required: call {name!r}: {err}: {args!r}")
        check(bool(tc.id), f"tools_required: call {name!r} has no id")
    check(len(calls) >= 1, f"tools_required: no tool_calls (content {ch.message.content!r})")
    check(ch.finish_reason == "tool_calls", f"tools_required: finish_reason {ch.finish_reason!r}, want tool_calls")
    return {"finish": ch.finish_reason, "calls": calls, "n_calls": len(calls), "content": ch.message.content}


@section("context_overflow")
def _(res):
    """A prompt over the model's window: litellm's ContextWindowExceededError."""
    try:
        litellm.completion(messages=[{"role": "user", "content": "word " * 9000}], **COMMON)
        res["raised"] = None
    except litellm.ContextWindowExceededError as e:
        res["raised"] = type(e).__name__
    check(res["raised"], f"context_overflow: no ContextWindowExceededError ({res})")


out["failures"] = failures
print(json.dumps(out, default=str))
if failures:
    print("litellm_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
