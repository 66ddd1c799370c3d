"""Ollama's API through the official `ollama` client (run by tests/ollama_api.rs).

Usage: ollama_check.py BASE_URL API_KEY MODEL

BASE_URL is the gateway's root (the client adds /api/...). The model is tiny, so the content is
nonsense-ish; what is checked is what the server guarantees: the shapes the client parses, greedy
answers equal whole and streamed, a JSON-schema format, a tool turn accepted, embeddings, the
listings, and errors the client raises as ResponseError with Ollama's status.

Prints ONE JSON object on stdout; hard failures are listed under "failures" (and the script exits 1).
"""
import json
import sys

import ollama
from checks import check, failures, out, section

base, key, model = sys.argv[1:4]
c = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
GREEDY = {"temperature": 0, "num_predict": 24}
ASK = [{"role": "user", "content": "Name three colors."}]


@section("listings")
def _(res):
    res["version"] = c._client.get("/api/version").json()
    names = [m.model for m in c.list().models]
    res["tags"] = names
    check(model in names, f"listings: {model} in /api/tags {names}")
    s = c.show(model)
    res["capabilities"] = s.capabilities
    res["details"] = s.details.model_dump()
    res["context_length"] = (s.modelinfo or {}).get(f"{s.details.family}.context_length")
    check("completion" in (s.capabilities or []), f"listings: show's capabilities {s.capabilities}")
    res["ps"] = [m.model for m in c.ps().models]
    check(model in res["ps"], "listings: the model is loaded (ps)")


@section("chat")
def _(res):
    r = c.chat(model=model, messages=ASK, options=GREEDY)
    pieces = list(c.chat(model=model, messages=ASK, options=GREEDY, stream=True))
    streamed = "".join(p.message.content or "" for p in pieces)
    last = pieces[-1]
    res.update({"content": r.message.content, "role": r.message.role, "done": r.done,
                "done_reason": r.done_reason, "eval_count": r.eval_count,
                "prompt_eval_count": r.prompt_eval_count, "pieces": len(pieces), "streamed": streamed,
                "last_done": last.done, "last_eval_count": last.eval_count})
    check(r.message.role == "assistant" and r.done, "chat: an assistant message, done")
    check(r.done_reason in ("stop", "length"), f"chat: done_reason {r.done_reason}")
    check(streamed == r.message.content, "chat: streamed pieces == the whole answer (greedy)")
    check(last.done and not any(p.done for p in pieces[:-1]), "chat: only the last piece is done")
    check((r.eval_count or 0) >= 1 and (r.prompt_eval_count or 0) > 5, "chat: counts")


@section("generate")
def _(res):
    r = c.generate(model=model, prompt="Name three colors.", options=GREEDY)
    streamed = "".join(p.response for p in c.generate(model=model, prompt="Name three colors.", options=GREEDY,
                                                      stream=True))
    raw = c.generate(model=model, prompt="The capital of France is", raw=True, options=GREEDY)
    res.update({"response": r.response, "streamed": streamed, "raw": raw.response,
                "chat_same": r.response == out["chat"].get("content")})
    check(streamed == r.response, "generate: streamed == whole (greedy)")
    check(res["chat_same"], "generate: a templated prompt answers as the same chat turn")
    check(raw.response != r.response, "generate: raw skips the template")
    loaded = c.generate(model=model)
    res["load"] = loaded.done_reason
    check(loaded.done and loaded.done_reason == "load", f"generate: no prompt loads ({loaded.done_reason})")


@section("format")
def _(res):
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["color", "count"], "additionalProperties": False}
    r = c.chat(model=model, messages=ASK, format=schema, options={"temperature": 0, "num_predict": 60})
    res["content"] = r.message.content
    try:
        v = json.loads(r.message.content)
        ok = v.get("color") in ("red", "green", "blue") and isinstance(v.get("count"), int)
    except (json.JSONDecodeError, AttributeError):
        ok = False
    res["valid"] = ok
    check(ok, f"format: follows the schema: {r.message.content!r}")
    j = c.generate(model=model, prompt="A JSON object about the sea:", format="json",
                   options={"temperature": 0, "num_predict": 40})
    try:
        res["json_object"] = isinstance(json.loads(j.response), dict)
    except json.JSONDecodeError:
        res["json_object"] = False
    # Cut at num_predict, an object may be unfinished; it is a JSON prefix either way.
    check(res["json_object"] or j.done_reason == "length", f"format: json: {j.response!r}")


def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
      city: The city's name

    Returns:
      str: The weather
    """
    return "sunny"


@section("tools")
def _(res):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat(model=model, messages=ask, tools=[get_weather], options={"temperature": 0, "num_predict": 80})
    calls = r.message.tool_calls or []
    res["first"] = {"content": r.message.content, "calls": [{"name": t.function.name, "args": dict(t.function.arguments)}
                                                            for t in calls]}
    # The model decides whether to call; either way the history with a call and its
    # result is accepted and answered.
    history = ask + [{"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                     {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 C"}]
    r2 = c.chat(model=model, messages=history, tools=[get_weather], options=GREEDY)
    res["second"] = {"content": r2.message.content, "done": r2.done}
    check(r2.done, "tools: the turn after a tool result is answered")


@section("embed")
def _(res):
    e = c.embed(model=model, input=["water", "fire"])
    one = c.embed(model=model, input="water")
    legacy = c.embeddings(model=model, prompt="water")
    res.update({"n": len(e.embeddings), "dims": [len(v) for v in e.embeddings],
                "same": e.embeddings[0] == one.embeddings[0] == list(legacy.embedding),
                "prompt_eval_count": e.prompt_eval_count})
    check(res["n"] == 2 and res["same"], "embed: two vectors; one input and /api/embeddings agree")


def error(fn):
    try:
        fn()
        return {"class": None}
    except ollama.ResponseError as e:
        return {"class": type(e).__name__, "status": e.status_code, "error": e.error}


@section("errors")
def _(res):
    res["unknown_model"] = error(lambda: c.chat(model="no-such-model", messages=ASK))
    res["show_unknown"] = error(lambda: c.show("no-such-model"))
    res["bad_option"] = error(lambda: c.chat(model=model, messages=ASK, options={"mirostat": 2}))
    res["image"] = error(lambda: c.chat(model=model, messages=[{"role": "user", "content": "?", "images": [b"\x89PNG"]}]))
    res["pull"] = error(lambda: c.pull(model))
    res["no_key"] = error(lambda: ollama.Client(host=base).list())
    res["stream_unknown_model"] = error(lambda: list(c.chat(model="no-such-model", messages=ASK, stream=True)))
    res["after"] = c.chat(model=model, messages=ASK, options=GREEDY).message.content == out["chat"].get("content")
    check(res["after"], "errors: the same greedy answer after the bad requests")


out["failures"] = failures
print(json.dumps(out))
if failures:
    print("ollama_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
