"""Which of the front's tokenizer calls a thread takes off the event loop: does the call let the
loop run while it works (releases the GIL), or hold it?

For each call (encode a long text, decode a long id list, render a long chat with the template),
times it alone, then runs it in a thread while the main thread asks to wake every 1 ms, and
prints the main thread's longest wait and how many wake-ups it got. A call that releases the GIL
leaves the main thread waking about every millisecond; one that holds it leaves one long gap
(decoding); pure-Python work (jinja) shares the GIL every switch interval (5 ms). The front's
choice (actors/router/tokenizer_thread.py): render and encode in a thread; decode kept small
(only new tokens) instead.

    python benchmarks/tokenizer_gil.py [--model-path DIR]     # default: the tiny test model
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def held_loop(label: str, call) -> None:
    call()  # warm: caches (a compiled chat template) are not what is measured
    start = time.perf_counter()
    call()
    alone = time.perf_counter() - start
    worker = threading.Thread(target=call)
    worker.start()
    gaps, last = [], time.perf_counter()
    while worker.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    print(f"{label:34s} alone {alone * 1000:8.1f} ms | in a thread: main thread woke {len(gaps):5d} times, "
          f"longest wait {max(gaps) * 1000:7.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", type=Path, default=None)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    model = args.model_path
    if model is None:
        from examples.models.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model, set_chat_template

        model = set_chat_template(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", arch="qwen2", seed=0),
                                  TOOL_CHAT_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    text = "The answer is 42, café ✓. " * 20000
    ids = tokenizer.encode(text, add_special_tokens=False)
    chat = [{"role": "user", "content": "What is 2 + 3? " * 50}, {"role": "assistant", "content": "5 " * 50}] * 50
    print(f"tokenizer {model}: {len(text)} characters = {len(ids)} tokens; a chat of {len(chat)} messages")
    held_loop("encode (fast tokenizer)", lambda: tokenizer.encode(text, add_special_tokens=False))
    held_loop("decode (fast tokenizer)", lambda: tokenizer.decode(ids))
    held_loop("render chat template x200 (jinja)",
              lambda: [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                       for _ in range(200)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
