"""A dedicated embedding model behind a switchyard gateway, as a RAG pipeline uses it
(run by tests/embedding_models.rs): the official OpenAI client and LangChain's
OpenAIEmbeddings against all-MiniLM-L6-v2, with a chat model in the same fleet.

Usage: embedding_model_check.py BASE_URL KEY EMBEDDING_MODEL CHAT_MODEL
Prints one JSON object; the Rust test asserts on it.
"""
import base64
import json
import struct
import sys

import openai

base, key, embedder, chat_model = sys.argv[1:5]
c = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
out = {}


def error_of(call):
    try:
        call()
        return {"class": None}
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "message": str(e)}


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


models = {m.id: m.model_dump() for m in c.models.list().data}
out["models"] = {k: {"embedding_dimension": v.get("embedding_dimension"),
                     "embedding_only": v.get("embedding_only", False)} for k, v in models.items()}
docs = ["A man is playing a guitar on stage.", "Someone performs music with a guitar.",
        "The stock market fell sharply on Monday."]
r = c.embeddings.create(model=embedder, input=docs)
vecs = [d.embedding for d in r.data]
out["dims"] = sorted({len(v) for v in vecs})
out["usage"] = r.usage.prompt_tokens
out["guitar_vs_guitar"] = dot(vecs[0], vecs[1])
out["guitar_vs_stocks"] = dot(vecs[0], vecs[2])
b64 = c.embeddings.create(model=embedder, input=docs[0], encoding_format="base64")
raw = b64.data[0].embedding
if isinstance(raw, str):
    raw = list(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
out["base64_same"] = max(abs(x - y) for x, y in zip(raw, vecs[0])) < 1e-6
out["ids"] = len(c.embeddings.create(model=embedder, input=[[101, 7592, 2088, 999, 102]]).data[0].embedding)
out["too_long"] = error_of(lambda: c.embeddings.create(model=embedder, input="word " * 600))
out["chat_to_embedder"] = error_of(lambda: c.chat.completions.create(
    model=embedder, messages=[{"role": "user", "content": "hi"}], max_tokens=4))
out["chat_still_works"] = c.chat.completions.create(
    model=chat_model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4).usage.completion_tokens

from langchain_openai import OpenAIEmbeddings

emb = OpenAIEmbeddings(base_url=base, api_key=key, model=embedder, max_retries=0,
                       check_embedding_ctx_length=False)
lc_docs = ["The train to Rome leaves at nine.", "Bananas are rich in potassium.",
           "The invoice is due on Friday."]
lc_vecs = emb.embed_documents(lc_docs)
q = emb.embed_query("Which fruit has a lot of potassium?")
scores = [dot(q, v) for v in lc_vecs]
out["langchain"] = {"n": len(lc_vecs), "closest": scores.index(max(scores))}
print(json.dumps(out))
