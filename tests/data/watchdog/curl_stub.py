#!/usr/bin/env python3
"""A stand-in for curl in the watchdog script tests: answers from files in $STUB (health: exit code;
metrics: a body, or 'hang'; completion: 'ok', 'hang' or an HTTP code), records argv and stdin."""
import json
import os
import sys

stub = os.environ["STUB"]
args = sys.argv[1:]
stdin = sys.stdin.read() if "-K" in args else ""
with open(os.path.join(stub, "calls.jsonl"), "a") as f:
    f.write(json.dumps({"argv": args, "stdin": stdin}) + "\n")
url = next(a for a in args if a.startswith("http"))
out = args[args.index("-o") + 1] if "-o" in args else None
fmt = args[args.index("-w") + 1] if "-w" in args else ""


def read(name, default=""):
    try:
        with open(os.path.join(stub, name)) as f:
            return f.read()
    except FileNotFoundError:
        return default


def answer(code, body=""):
    if out and out != "/dev/null":
        with open(out, "w") as f:
            f.write(body)
    if fmt:
        sys.stdout.write(fmt.replace("%{http_code}", str(code)))
    sys.exit(0)


if url.endswith("/health"):
    rc = int(read("health", "0") or 0)
    sys.exit(rc)
if url.endswith("/metrics"):
    body = read("metrics", None)
    if body is None:
        answer(404, "not found")
    if body.strip() == "hang":
        sys.stdout.write(fmt.replace("%{http_code}", "000"))
        sys.exit(28)
    answer(200, body)
if url.endswith("/v1/completions"):
    what = read("completion", "ok").strip()
    if what == "hang":
        sys.stdout.write(fmt.replace("%{http_code}", "000"))
        sys.exit(28)
    if what == "ok":
        answer(200, json.dumps({"choices": [{"text": "o"}]}))
    answer(int(what), "{}")
sys.exit(7)
