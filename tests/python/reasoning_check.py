"""A reasoning model's thinking, split from its answer on every API, through the official clients
(run by tests/reasoning.rs).

Usage: reasoning_check.py BASE_URL QWEN3_MODEL OPENED_MODEL

QWEN3_MODEL is a random-weight model with Qwen3's own chat template (the model opens a `<think>`
section itself, `enable_thinking: false` closes an empty one in the prompt); OPENED_MODEL the same
weights with a template whose assistant opener leaves `<think>` open, as DeepSeek-R1's does. Random
weights write no reasoning of their own, so a regular expression (switchyard's `regex` extra) makes
them write a section and an answer; what is checked is what the server guarantees: the section's
text comes back as reasoning and only the rest as the answer, whole and streamed alike (greedy), the
same text as the raw answer (`reasoning_format: "none"`), and the thinking switches reach the
template (the prompt grows by the closed empty section).

Prints ONE JSON object on stdout; hard failures are listed under "failures" (and the script exits 1).
"""
import json
import re
import sys
import urllib.request

import anthropic
import ollama
import openai
from checks import check, failures, out, reach, section

base, qwen3, opened = sys.argv[1:4]
KEY = "unused"
reach(f"{base}/v1", KEY, "reasoning_check.py")
oa = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
ol = ollama.Client(host=base, timeout=120)

WORD = "[a-z]{5,20}"
ANSWER = "[a-z]{3,20}"
# The model opens and closes the section itself (Qwen3's way).
OWN = f"<think>\n{WORD}\n</think>\n\n{ANSWER}"
# The template opened it: the answer starts inside the reasoning.
INSIDE = f"{WORD}\n</think>\n\n{ANSWER}"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 100}


def extra(obj, name):
    """A field the SDK's types do not declare (`reasoning_content`)."""
    return (getattr(obj, "model_extra", None) or {}).get(name)


def split_ok(where, reasoning, text):
    check(re.fullmatch(WORD, reasoning or "") is not None, f"{where}: reasoning {reasoning!r} is the section's text")
    check(re.fullmatch(ANSWER, text or "") is not None, f"{where}: answer {text!r} is the rest")


@section("chat")
def _(res):
    whole = oa.chat.completions.create(model=qwen3, messages=ASK, extra_body={"regex": OWN}, **GREEDY)
    m = whole.choices[0].message
    reasoning = extra(m, "reasoning_content")
    res.update({"reasoning": reasoning, "content": m.content, "tokens": whole.usage.completion_tokens})
    split_ok("chat", reasoning, m.content)
    raw = oa.chat.completions.create(model=qwen3, messages=ASK,
                                     extra_body={"regex": OWN, "reasoning_format": "none"}, **GREEDY)
    res["raw"] = raw.choices[0].message.content
    check(raw.choices[0].message.content == f"<think>\n{reasoning}\n</think>\n\n{m.content}",
          "chat: the raw answer is the section and the answer, tags and all")
    check(extra(raw.choices[0].message, "reasoning_content") is None, "chat: no reasoning_content when raw")
    check(raw.usage.completion_tokens == whole.usage.completion_tokens, "chat: split or raw, the same tokens")
    streamed = {"reasoning": "", "content": ""}
    for chunk in oa.chat.completions.create(model=qwen3, messages=ASK, stream=True,
                                            extra_body={"regex": OWN}, **GREEDY):
        for ch in chunk.choices:
            streamed["reasoning"] += extra(ch.delta, "reasoning_content") or ""
            streamed["content"] += ch.delta.content or ""
    res["streamed"] = streamed
    check(streamed == {"reasoning": reasoning, "content": m.content}, "chat: streamed as whole")


@section("switches")
def _(res):
    """Thinking off closes an empty section in Qwen3's prompt: more prompt tokens."""
    def prompt_tokens(**kw):
        r = oa.chat.completions.create(model=qwen3, messages=ASK, temperature=0, max_tokens=1, **kw)
        return r.usage.prompt_tokens
    on = prompt_tokens()
    res["prompt_tokens"] = {
        "default": on,
        "kwargs_off": prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
        "effort_none": prompt_tokens(extra_body={"reasoning_effort": "none"}),
        "kwargs_on": prompt_tokens(extra_body={"chat_template_kwargs": {"enable_thinking": True}}),
    }
    p = res["prompt_tokens"]
    check(p["kwargs_off"] > on and p["effort_none"] == p["kwargs_off"], f"switches: thinking off reaches the template {p}")
    check(p["kwargs_on"] == on, f"switches: thinking on is the template's default {p}")
    counted = {
        t: an.messages.count_tokens(model=qwen3, messages=ASK, thinking=th).input_tokens
        for t, th in [("on", {"type": "enabled", "budget_tokens": 1024}), ("off", {"type": "disabled"})]
    }
    res["anthropic_count"] = counted
    check(counted["off"] == p["kwargs_off"] and counted["on"] == on, f"switches: Anthropic's thinking {counted}")
    r = ol.chat(model=qwen3, messages=ASK, think=False, options={"num_predict": 1, "temperature": 0})
    res["ollama_off"] = r.prompt_eval_count
    check(r.prompt_eval_count == p["kwargs_off"], f"switches: Ollama's think=false ({r.prompt_eval_count})")
    try:
        oa.chat.completions.create(model=qwen3, messages=ASK, max_tokens=1,
                                   extra_body={"chat_template_kwargs": {"messages": []}})
        check(False, "switches: kwargs naming the template's own variables are refused")
    except openai.BadRequestError as e:
        res["refused"] = e.message
        check("messages" in e.message, f"switches: the refusal names the variable: {e.message}")


@section("opened")
def _(res):
    """A template that opens the section: the answer starts inside the reasoning."""
    whole = oa.chat.completions.create(model=opened, messages=ASK, extra_body={"regex": INSIDE}, **GREEDY)
    m = whole.choices[0].message
    res["chat"] = {"reasoning": extra(m, "reasoning_content"), "content": m.content}
    split_ok("opened chat", extra(m, "reasoning_content"), m.content)
    raw = oa.chat.completions.create(model=opened, messages=ASK,
                                     extra_body={"regex": INSIDE, "reasoning_format": "none"}, **GREEDY)
    check(raw.choices[0].message.content == f"{res['chat']['reasoning']}\n</think>\n\n{m.content}",
          f"opened chat: raw {raw.choices[0].message.content!r}")
    res["expect"] = [res["chat"]["reasoning"], m.content]


@section("anthropic")
def _(res):
    want = out["opened"]["expect"]
    kw = {"model": opened, "max_tokens": 100, "messages": ASK, "extra_body": {"regex": INSIDE, "temperature": 0}}
    m = an.messages.create(**kw)
    res["blocks"] = [b.type for b in m.content]
    check(res["blocks"] == ["thinking", "text"], f"anthropic: blocks {res['blocks']}")
    check([m.content[0].thinking, m.content[1].text] == want, "anthropic: thinking and text as chat's")
    events = []
    with an.messages.stream(**kw) as s:
        for ev in s:
            if ev.type in ("content_block_start", "content_block_stop"):
                events.append(f"{ev.type}:{ev.index}")
            elif ev.type == "content_block_delta":
                events.append(f"{ev.delta.type}:{ev.index}")
        final = s.get_final_message()
    res["events"] = sorted(set(events))
    for e in ["content_block_start:0", "thinking_delta:0", "signature_delta:0", "content_block_stop:0",
              "content_block_start:1", "text_delta:1", "content_block_stop:1"]:
        check(e in events, f"anthropic stream: {e}")
    check([b.type for b in final.content] == ["thinking", "text"]
          and [final.content[0].thinking, final.content[1].text] == want, "anthropic stream: as whole")


@section("responses")
def _(res):
    want = out["opened"]["expect"]
    kw = {"model": opened, "input": "What is the capital of France?", "temperature": 0,
          "max_output_tokens": 100, "extra_body": {"regex": INSIDE}, "store": False}
    r = oa.responses.create(**kw)
    res["items"] = [i.type for i in r.output]
    check(res["items"] == ["reasoning", "message"], f"responses: items {res['items']}")
    check([r.output[0].content[0].text, r.output_text] == want, "responses: reasoning item and text as chat's")
    reasoning_tokens = r.usage.output_tokens_details.reasoning_tokens
    res["reasoning_tokens"] = reasoning_tokens
    check(0 < reasoning_tokens < r.usage.output_tokens, "responses: reasoning tokens counted apart")
    kinds = []
    with oa.responses.stream(**kw) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_response()
    res["events"] = sorted(set(kinds))
    for k in ["response.reasoning_text.delta", "response.reasoning_text.done", "response.output_text.delta"]:
        check(k in kinds, f"responses stream: {k}")
    check([final.output[0].content[0].text, final.output_text] == want, "responses stream: as whole")


@section("ollama")
def _(res):
    """No regex on Ollama's API: the opened section runs to the token limit, all thinking."""
    opts = {"num_predict": 12, "temperature": 0}
    r = ol.chat(model=opened, messages=ASK, options=opts)
    res["chat"] = {"thinking": r.message.thinking, "content": r.message.content}
    check(bool(r.message.thinking) and r.message.content == "", f"ollama chat: {res['chat']}")
    streamed = {"thinking": "", "content": ""}
    for part in ol.chat(model=opened, messages=ASK, options=opts, stream=True):
        streamed["thinking"] += part.message.thinking or ""
        streamed["content"] += part.message.content or ""
    check(streamed == res["chat"], f"ollama chat stream: as whole {streamed}")
    g = ol.generate(model=opened, prompt="What is the capital of France?", options=opts)
    res["generate"] = {"thinking": g.thinking, "response": g.response}
    check(g.thinking == r.message.thinking and g.response == "", f"ollama generate: {res['generate']}")
    # Raw HTTP: the field is `thinking` on the message.
    body = json.dumps({"model": opened, "messages": ASK, "stream": False, "options": opts}).encode()
    req = urllib.request.Request(f"{base}/api/chat", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        raw = json.load(resp)
    check(raw["message"].get("thinking") == r.message.thinking, "ollama: message.thinking on the wire")


out["failures"] = failures
print(json.dumps(out))
sys.exit(1 if failures else 0)
