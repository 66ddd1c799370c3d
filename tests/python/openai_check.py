"""The official OpenAI client against a switchyard gateway (run by tests/gateway.rs).

Usage: openai_check.py BASE_URL GOOD_KEY LIMITED_KEY RESTRICTED_KEY MODEL
Prints one JSON object with what each call returned; the Rust test asserts on it.
"""
import json
import sys

import openai

base, good, limited, restricted, model = sys.argv[1:6]
c = openai.OpenAI(base_url=base, api_key=good, max_retries=0)
out = {}

r = c.chat.completions.create(model=model, messages=[
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"}], max_tokens=24)
out["chat"] = {"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
               "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens,
               "cached": r.usage.prompt_tokens_details.cached_tokens, "object": r.object}

greedy = [c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a color."}],
                                    max_completion_tokens=8, temperature=0).choices[0].message.content
          for _ in range(2)]
out["greedy_same"] = greedy[0] == greedy[1]

parts, finish, usage = [], None, None
stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                   max_tokens=12, stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage.completion_tokens
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.finish_reason:
            finish = ch.finish_reason
out["chat_stream"] = {"text": "".join(parts), "finish": finish, "usage": usage, "chunks": len(parts)}

r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=6, temperature=0, stop=["\n"])
out["completion"] = {"text": r.choices[0].text, "finish": r.choices[0].finish_reason,
                     "completion_tokens": r.usage.completion_tokens}
text = "".join(ch.choices[0].text for ch in c.completions.create(
    model=model, prompt="The capital of France is", max_tokens=6, temperature=0, stop=["\n"], stream=True)
    if ch.choices)
out["completion_stream_same"] = text == r.choices[0].text

out["models"] = [m.id for m in c.models.list().data]
out["embedding_dimension"] = c.models.list().data[0].model_extra.get("embedding_dimension")
out["retrieve"] = c.models.retrieve(model).id

# n choices, whole and streamed; seeded, so the same request gives the same choices.
ask = dict(model=model, messages=[{"role": "user", "content": "Name an animal."}], max_tokens=8,
           temperature=1.0, seed=7, n=3)
whole = [c.chat.completions.create(**ask) for _ in range(2)]
streamed = {}
for chunk in c.chat.completions.create(**ask, stream=True):
    for ch in chunk.choices:
        streamed.setdefault(ch.index, []).append(ch.delta.content or "")
out["n3"] = {"indexes": [ch.index for ch in whole[0].choices],
             "texts": [ch.message.content for ch in whole[0].choices],
             "same_again": [ch.message.content for ch in whole[0].choices]
             == [ch.message.content for ch in whole[1].choices],
             "streamed": ["".join(streamed.get(i, [])) for i in range(3)],
             "completion_tokens": whole[0].usage.completion_tokens,
             "prompt_tokens": whole[0].usage.prompt_tokens}

# Log-probabilities, whole and streamed (greedy: the same tokens both ways), and
# the legacy completions form.
ask = dict(model=model, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=6,
           temperature=0, logprobs=True, top_logprobs=3)
r = c.chat.completions.create(**ask)
whole = [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
          "top": [[a.token, a.logprob] for a in t.top_logprobs]} for t in r.choices[0].logprobs.content]
streamed = []
for chunk in c.chat.completions.create(**ask, stream=True):
    for ch in chunk.choices:
        if ch.logprobs and ch.logprobs.content:
            streamed += [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
                          "top": [[a.token, a.logprob] for a in t.top_logprobs]} for t in ch.logprobs.content]
plain = c.chat.completions.create(**{k: v for k, v in ask.items() if k not in ("logprobs", "top_logprobs")})
r2 = c.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
out["logprobs"] = {"text": r.choices[0].message.content, "whole": whole, "streamed": streamed,
                   "plain_logprobs": plain.choices[0].logprobs is None,
                   "completion": r2.choices[0].logprobs.model_dump(), "completion_text": r2.choices[0].text}

# Embeddings: one string, a list (the SDK asks for base64 and decodes it), floats
# asked for explicitly, and token ids.
one = c.embeddings.create(model=model, input="The capital of France is Paris.")
many = c.embeddings.create(model=model, input=["I loved this film.", "Terrible service.", "The capital of France is Paris."])
floats = c.embeddings.create(model=model, input="The capital of France is Paris.", encoding_format="float")
ids = c.embeddings.create(model=model, input=[[504, 3575, 282], [19556]])
out["embeddings"] = {"one": one.data[0].embedding, "many": [d.embedding for d in many.data],
                     "indexes": [d.index for d in many.data], "floats": floats.data[0].embedding,
                     "prompt_tokens": one.usage.prompt_tokens, "ids": [len(d.embedding) for d in ids.data],
                     "object": one.object}


def error_of(fn):
    try:
        fn()
        return None
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "code": (e.body or {}).get("code")
                if isinstance(e.body, dict) else None}


out["bad_key"] = error_of(lambda: openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
                          .chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}]))
out["unknown_model"] = error_of(lambda: c.chat.completions.create(
    model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=2))
out["presence_penalty"] = error_of(lambda: c.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2, presence_penalty=3.0))


def listing(**penalties):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": "List ten colors."}],
                                     max_tokens=24, temperature=0, **penalties).choices[0].message.content


out["penalties"] = {"plain": listing(), "penalised": listing(presence_penalty=1.5, frequency_penalty=1.5),
                    "again": listing(presence_penalty=1.5, frequency_penalty=1.5)}
out["n0"] = error_of(lambda: c.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2, n=0))
out["n1000"] = error_of(lambda: c.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2, n=1000))
out["top_logprobs21"] = error_of(lambda: c.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2, logprobs=True, top_logprobs=21))
out["embed_empty_list"] = error_of(lambda: c.embeddings.create(model=model, input=[]))
out["embed_empty_string"] = error_of(lambda: c.embeddings.create(model=model, input=["a", ""]))
out["embed_2049"] = error_of(lambda: c.embeddings.create(model=model, input=["x"] * 2049))
out["embed_bad_token"] = error_of(lambda: c.embeddings.create(model=model, input=[[1, 999999]]))
out["embed_too_long"] = error_of(lambda: c.embeddings.create(model=model, input="word " * 9000))
out["overflow"] = error_of(lambda: c.completions.create(model=model, prompt="word " * 9000, max_tokens=2))
lim = openai.OpenAI(base_url=base, api_key=limited, max_retries=0)
out["limited_first"] = error_of(lambda: lim.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2))
out["limited_second"] = error_of(lambda: lim.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "x"}], max_tokens=2))
out["restricted"] = error_of(lambda: openai.OpenAI(base_url=base, api_key=restricted, max_retries=0)
                             .chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}]))
print(json.dumps(out))
