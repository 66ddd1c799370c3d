"""LangChain's ChatOpenAI against a switchyard gateway: structured output and tools (run by the gateway's tests).

Usage: langchain_check.py BASE_URL API_KEY MODEL

Prints ONE JSON object on stdout with what each call returned; the Rust test asserts on it.
Every hard failure is also listed under "failures" and on stderr, and the script then exits 1;
it exits 2 when the gateway cannot be reached at all.
"""
import json
import sys
from importlib.metadata import version
from typing import Literal, Optional

import openai
from checks import check, failures, out, reach, section
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, ValidationError

base, key, model = sys.argv[1:4]
out.update({"langchain_openai": version("langchain-openai"), "langchain_core": version("langchain-core")})




reach(base, key, "langchain_check")

llm = ChatOpenAI(base_url=base, api_key=key, model=model, temperature=0, max_tokens=300, max_retries=0, timeout=120)


class Stop(BaseModel):
    """One stop of a trip."""
    city: str = Field(max_length=40)
    nights: int = Field(ge=1, le=14)


class Trip(BaseModel):
    """A trip plan."""
    destination: str = Field(description="Where the trip goes", max_length=40)
    transport: Literal["train", "plane", "car"]
    budget_eur: float = Field(ge=0, le=10000)
    note: Optional[str] = Field(default=None, max_length=60)
    stops: list[Stop] = Field(min_length=1, max_length=3)


TRIP_PROMPT = [SystemMessage("You plan trips."),
               HumanMessage("Plan a one-week train trip to Italy for 900 euros, stopping in Rome and Florence.")]


class Place(BaseModel):
    """Where a landmark is (json_mode: the prompt spells out the fields, nothing enforces them)."""
    city: str
    country: str


PLACE_PROMPT = [SystemMessage('Reply with a JSON object only, with exactly the keys "city" and "country", '
                              'like {"city": "Paris", "country": "France"}.'),
                HumanMessage("Where is the Colosseum?")]


def raw_of(msg):
    return {"content": msg.content, "tool_calls": msg.tool_calls, "invalid_tool_calls": msg.invalid_tool_calls,
            "finish": msg.response_metadata.get("finish_reason")}


for method in ["json_schema", "function_calling", "json_mode"]:
    @section(f"structured_{method}")
    def _(res, method=method):
        """with_structured_output(PydanticModel, method=...) returns a validated instance."""
        schema, prompt = (Place, PLACE_PROMPT) if method == "json_mode" else (Trip, TRIP_PROMPT)
        r = llm.with_structured_output(schema, method=method, include_raw=True).invoke(prompt)
        parsed, err = r["parsed"], r["parsing_error"]
        res = {"schema": schema.__name__, "raw": raw_of(r["raw"]),
               "parsed": parsed.model_dump(mode="json") if isinstance(parsed, BaseModel) else parsed,
               "parsing_error": None if err is None else f"{type(err).__name__}: {err}",
               "valid": isinstance(parsed, schema)}
        if method == "json_mode":
            # What the server guarantees here is JSON (an object); the field names are up to the
            # model, so "valid" is recorded but only the JSON is a hard requirement.
            try:
                res["is_dict"] = isinstance(json.loads(r["raw"].content), dict)
            except (json.JSONDecodeError, TypeError):
                res["is_dict"] = False
            check(res["is_dict"], f"structured_json_mode: content is not a JSON object: {r['raw'].content!r}")
        else:
            check(res["valid"], f"structured_{method}: no validated {schema.__name__}: {res['parsing_error']}: {res['raw']}")
        return res


class GetWeather(BaseModel):
    """Current weather in a city."""
    city: str = Field(description="City name, e.g. Paris")
    unit: Literal["celsius", "fahrenheit"]


class GetTime(BaseModel):
    """Current local time in a time zone."""
    timezone: str = Field(description="IANA time zone, e.g. Europe/Paris")


TOOLS = {"GetWeather": GetWeather, "GetTime": GetTime}
ASK = [SystemMessage("You are a helpful assistant. Use the tools to answer."),
       HumanMessage("What is the weather in Paris in celsius, and what time is it in Europe/Paris?")]


def calls_of(msg, what):
    calls = []
    for tc in msg.tool_calls:
        cls = TOOLS.get(tc["name"])
        err = None
        if cls is None:
            err = f"unknown tool {tc['name']!r}"
        else:
            try:
                cls.model_validate(tc["args"])
            except ValidationError as e:
                err = str(e)
        calls.append({"id": tc["id"], "name": tc["name"], "args": tc["args"], "valid": err is None, "error": err})
        check(err is None, f"{what}: call {tc['name']!r}: {err}: {tc['args']}")
        check(bool(tc["id"]), f"{what}: call {tc['name']!r} has no id")
    check(len(calls) >= 1, f"{what}: no tool_calls (content {msg.content!r})")
    check(not msg.invalid_tool_calls, f"{what}: invalid_tool_calls {msg.invalid_tool_calls}")
    return calls


@section("bind_tools")
def _(res):
    """bind_tools([...], tool_choice="any") (LangChain maps "any" to "required"), then one loop step."""
    bound = llm.bind_tools(list(TOOLS.values()), tool_choice="any")
    msg = bound.invoke(ASK)
    res.update({"calls": calls_of(msg, "bind_tools"), "finish": msg.response_metadata.get("finish_reason"),
                "invalid_tool_calls": msg.invalid_tool_calls})
    check(res["finish"] == "tool_calls", f"bind_tools: finish_reason {res['finish']!r}, want tool_calls")
    # LangChain writes the assistant's tool_calls and the ToolMessages back itself.
    history = ASK + [msg] + [ToolMessage('{"ok": true, "value": "18 C, cloudy"}' if tc["name"] == "GetWeather"
                                         else '{"ok": true, "value": "14:05"}', tool_call_id=tc["id"])
                             for tc in msg.tool_calls]
    final = llm.bind_tools(list(TOOLS.values()), tool_choice="none").invoke(history)
    res["then_none"] = {"content": final.content, "tool_calls": final.tool_calls,
                        "finish": final.response_metadata.get("finish_reason")}
    check(isinstance(final.content, str) and final.content.strip(), f"bind_tools then none: empty answer: {final}")
    check(not final.tool_calls, f"bind_tools then none: tool_calls {final.tool_calls}")
    return res


@section("bind_tools_stream")
def _(res):
    """The same required call, streamed: LangChain assembles the chunks."""
    acc = None
    for chunk in llm.bind_tools(list(TOOLS.values()), tool_choice="any").stream(ASK):
        acc = chunk if acc is None else acc + chunk
    check(isinstance(acc, AIMessageChunk), f"bind_tools_stream: no chunks ({acc!r})")
    return {"calls": calls_of(acc, "bind_tools_stream"), "finish": acc.response_metadata.get("finish_reason"),
            "invalid_tool_calls": acc.invalid_tool_calls}


@section("context_overflow")
def _(res):
    """A prompt over the model's window: LangChain's ContextOverflowError (the gateway's
    code is OpenAI's context_length_exceeded), so trimming and fallbacks can act on it."""
    from langchain_core.exceptions import ContextOverflowError
    try:
        llm.invoke([HumanMessage("word " * 9000)])
        res["raised"] = None
    except ContextOverflowError as e:
        res["raised"] = type(e).__name__
    check(res["raised"], f"context_overflow: no ContextOverflowError ({res})")


@section("embeddings")
def _(res):
    """OpenAIEmbeddings (what a vector store loader uses): documents and a query, one
    vector each of the model's width, the query closest to the document it repeats."""
    from langchain_openai import OpenAIEmbeddings
    emb = OpenAIEmbeddings(base_url=base, api_key=key, model=model, max_retries=0,
                           check_embedding_ctx_length=False)
    docs = ["The train to Rome leaves at nine.", "Bananas are rich in potassium.",
            "The invoice is due on Friday."]
    vecs = emb.embed_documents(docs)
    q = emb.embed_query("Bananas are rich in potassium.")
    dot = [sum(a * b for a, b in zip(q, v)) for v in vecs]
    res.update({"n": len(vecs), "dims": sorted({len(v) for v in vecs}), "closest": dot.index(max(dot))})
    check(res["n"] == 3 and res["closest"] == 1, f"embeddings: {res}")


out["failures"] = failures
print(json.dumps(out, default=str))
if failures:
    print("langchain_check: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
