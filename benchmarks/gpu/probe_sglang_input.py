"""Print SGLang's raw answers to the prompt-logprob and token-id requests the CPU engine must
answer alike (benchmarks/gpu/sglang_input_contract.sh): logprob_start_len at / past the input,
the default start with and without generation, and last an out-of-vocabulary input id (which
kills SGLang 0.5.17's scheduler). Usage: probe_sglang_input.py URL VOCAB_SIZE."""
import json, sys, urllib.request
url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            a = json.loads(r.read())
            return {k: a["meta_info"].get(k) for k in ("input_token_logprobs", "output_token_logprobs", "prompt_tokens", "finish_reason")} | {"output_ids": a.get("output_ids")}
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read()[:300]!r}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
P = [11, 12, 13, 14, 15, 16, 18]
sp = {"max_new_tokens": 1, "temperature": 0}
for name, body in [
    ("start_len_eq_len_gen1", {"input_ids": P, "sampling_params": sp, "return_logprob": True, "logprob_start_len": len(P)}),
    ("start_len_len_plus3_gen1", {"input_ids": P, "sampling_params": sp, "return_logprob": True, "logprob_start_len": len(P) + 3}),
    ("start_len_eq_len_gen0", {"input_ids": P, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": len(P)}),
    ("start_len_lenminus1_gen0", {"input_ids": P, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": len(P) - 1}),
    ("default_gen2", {"input_ids": P, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_logprob": True}),
    ("default_gen0", {"input_ids": P, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}),
    ("oov_no_logprob", {"input_ids": P + [int(sys.argv[2]) + 5], "sampling_params": sp}),
]:
    print(name, "->", post(body), flush=True)
