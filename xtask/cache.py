#!/usr/bin/env python3
"""What a run costs with a provider's prompt cache (BENCHMARKS.md, "Prompt caching").

The release `agent` against an OpenAI-compatible server on 127.0.0.1 (this script): N
turns, each one `read_file` of its own 2 KB file, then a final answer. The server records
every request body. Printed, over the N + 1 requests:

- the share of the characters sent that is a byte-identical prefix of the previous
  request (what a provider's prompt cache can serve), each request taken in the order the
  provider reads it: the tools, then the messages;
- the largest request, against a naive resend (every result whole, every turn);
- the cost with cache prices (a token read from the cache at 0.1 of an input token),
  against the naive resend with the same caching. Tokens are estimated at four
  characters; output tokens are the same in both and left out.

    python3 xtask/cache.py [--turns 50] [--agent PATH] [--config TOML]

`--config` adds lines to the run's agent.toml (to compare settings).
"""

import argparse
import http.server
import json
import os
import random
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READ_PRICE = 0.1


def file_text(i):
    rng = random.Random(i)
    words = ["alpha", "beta", "gamma", "delta", "record", "value", "field", "entry"]
    lines = []
    size = 0
    while size < 2000:
        line = f"{i:03}-{len(lines):02} " + " ".join(rng.choice(words) for _ in range(8))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:2000] + "\n"


class Server(http.server.ThreadingHTTPServer):
    def __init__(self, turns):
        super().__init__(("127.0.0.1", 0), Handler)
        self.turns = turns
        self.bodies = []


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers["content-length"])
        raw = self.rfile.read(length).decode()
        k = len(self.server.bodies)
        self.server.bodies.append(raw)
        if k < self.server.turns:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {"name": "read_file",
                                 "arguments": json.dumps({"path": f"data/f{k:03}.txt"})},
                }],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "All records read."}
            finish = "stop"
        body = json.dumps({
            "id": f"chatcmpl-{k}", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": 20},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cached_order(raw):
    """A request as the provider's cache sees it: the tools, then the messages in order
    (the system text first). Fields like `model` and `stream` are left out, and the JSON
    object's own key order (which puts `tools` last) does not matter."""
    body = json.loads(raw)
    parts = [json.dumps(body.get("tools", []), separators=(",", ":"))]
    parts += [json.dumps(m, separators=(",", ":")) for m in body["messages"]]
    return "".join(parts)


def naive(bodies):
    """The same requests with every tool result whole: each result message's content is
    put back from the file it read."""
    out = []
    for raw in bodies:
        body = json.loads(raw)
        for m in body["messages"]:
            if m["role"] == "tool" and m["tool_call_id"].startswith("call_"):
                k = int(m["tool_call_id"][len("call_"):])
                m["content"] = file_text(k)
        out.append(cached_order(json.dumps(body)))
    return out


def figures(bodies):
    sent = sum(len(b) for b in bodies)
    prefix = sum(common_prefix(bodies[i - 1], b) for i, b in enumerate(bodies) if i > 0)
    cost = sum(
        (len(b) - p) + READ_PRICE * p
        for b, p in zip(bodies, [0] + [common_prefix(bodies[i - 1], b)
                                        for i, b in enumerate(bodies) if i > 0])
    ) / 4
    return sent, prefix, max(len(b) for b in bodies), cost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--agent", default=os.path.join(ROOT, "target", "release", "agent"))
    ap.add_argument("--config", default="")
    args = ap.parse_args()
    if not os.path.exists(args.agent):
        subprocess.run(["cargo", "build", "-q", "--release", "-p", "agent-cli"],
                       cwd=ROOT, check=True)
    server = Server(args.turns)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as work:
        os.mkdir(os.path.join(work, "data"))
        for k in range(args.turns):
            with open(os.path.join(work, "data", f"f{k:03}.txt"), "w") as f:
                f.write(file_text(k))
        with open(os.path.join(work, "agent.toml"), "w") as f:
            f.write("stream = false\n" + args.config.replace("\\n", "\n") + "\n")
        out = subprocess.run(
            [args.agent, "run", "--json", "--model", "openai-compat:m", "--base-url",
             f"http://127.0.0.1:{server.server_address[1]}/v1", "--workspace", work,
             "--store", os.path.join(work, ".agent"), "--max-steps", str(args.turns + 5),
             "--max-tool-calls", str(args.turns + 5), "read every record"],
            cwd=work, capture_output=True, text=True,
        )
        if out.returncode != 0:
            sys.exit(f"agent failed ({out.returncode}): {out.stderr}")
    server.shutdown()
    bodies = [cached_order(b) for b in server.bodies]
    sent, prefix, peak, cost = figures(bodies)
    n_sent, n_prefix, n_peak, n_cost = figures(naive(server.bodies))
    print(f"{len(bodies)} requests, {sent} characters sent")
    print(f"prefix of the previous request: {prefix / sent:.1%} of the characters "
          f"(naive resend: {n_prefix / n_sent:.1%})")
    print(f"largest request: {peak} characters, {peak / n_peak:.1%} of the naive resend's "
          f"{n_peak}")
    print(f"cost with cache reads at {READ_PRICE}: {cost:,.0f} input-token units, "
          f"{cost / n_cost:.1%} of the naive resend's {n_cost:,.0f}")
    # The floor under both goals at once. Whatever the projection, each request carries
    # characters no earlier request held (its new call and result, the first request
    # whole): at least what the naive resend sends uncached. A prefix share of 90% means
    # nine cached characters for each uncached one, so the cost is at least that many
    # uncached characters plus nine times as many read from the cache.
    fresh = n_sent - n_prefix
    floor = (fresh + READ_PRICE * 9 * fresh) / 4
    print(f"floor of any projection with a 90% prefix: {floor:,.0f} units, "
          f"{floor / n_cost:.1%} of the naive resend's cost")


if __name__ == "__main__":
    main()
