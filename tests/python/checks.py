"""What the client check scripts share: the report they print (`out`, with the hard
`failures`), `check` for a hard condition, `section` for a named part that survives
an exception, and `reach` to fail fast (exit 2) when the gateway is not there."""

import sys
import traceback

import openai

out = {}
failures = []


def check(cond, what):
    """Records a hard failure when cond is false; returns cond."""
    if not cond:
        failures.append(what)
    return bool(cond)


def section(name):
    """Runs fn(res) with res = out[name]: fn fills res (partial results survive an exception) or
    returns a dict merged into it. An exception is recorded under res["error"], not fatal."""
    def wrap(fn):
        res = out[name] = {}
        try:
            res.update(fn(res) or {})
        except Exception as e:  # noqa: BLE001 - every error is reported, the rest still runs
            res["error"] = f"{type(e).__name__}: {e}"
            failures.append(f"{name}: raised {type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
        return fn
    return wrap


def reach(base, key, who):
    """Exits 2 with a clear message when no gateway answers at `base`."""
    try:
        openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30).models.list()
    except openai.APIConnectionError as e:
        print(f"{who}: cannot reach the gateway at {base}: {e!r} ({e.__cause__!r})", file=sys.stderr)
        sys.exit(2)
