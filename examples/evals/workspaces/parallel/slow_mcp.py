"""An MCP server over stdio whose one tool, `wait`, answers after `ms` milliseconds.

Each call is answered from its own thread, so calls made together come back in the order
their waits end, not the order they were made: the evaluation case `parallel-reads` uses
it to check that results are still correlated by call id.
"""
import json
import sys
import threading
import time

lock = threading.Lock()


def send(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def answer_later(mid, arguments):
    time.sleep(arguments.get("ms", 0) / 1000.0)
    text = arguments.get("text", "")
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}]}})


for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, mid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "slow", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{
            "name": "wait", "description": "answers `text` after `ms` milliseconds",
            "annotations": {"readOnlyHint": True},
            "inputSchema": {"type": "object", "required": ["ms", "text"], "properties": {
                "ms": {"type": "integer"}, "text": {"type": "string"}}}}]}
    elif method == "tools/call":
        threading.Thread(target=answer_later, args=(mid, msg["params"]["arguments"])).start()
        continue
    else:
        result = {}
    send({"jsonrpc": "2.0", "id": mid, "result": result})
