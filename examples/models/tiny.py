"""Build a tiny random-init causal LM (Qwen2 / Llama / Qwen3, or a Qwen3-MoE) plus a locally
trained tokenizer.

Nothing can be downloaded in CI, so every test and the CPU quick start use a model written
by this module: an HF-format directory (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template) that
transformers' Auto classes, the embedded CPU engine and SGLang all load.

    python -m examples.models.tiny --out DIR [--arch qwen2] [--seed 0] [--corpus FILE]   # from the repository root

The tokenizer is a byte-level BPE trained on a small corpus generated here (arithmetic,
countdown-style prompts, chat words). Digits are split into single characters before BPE
runs, so "123" is always three tokens: the arithmetic task learned with it depends on that.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# torch, tokenizers and transformers load inside the functions that use them: importing this
# module (`python -m examples.models.tiny --help`, the spec's constants) should not cost seconds.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ARCHS = ("qwen2", "llama", "qwen3", "qwen3_moe")

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IM_START, IM_END]

# Words, single digits (`\p{N}` matches one), punctuation runs, newlines, spaces. This is the
# split Qwen2's tokenizer class applies: transformers' AutoTokenizer rebuilds a "qwen2" model's
# tokenizer with it whatever tokenizer.json says, so training with the same split keeps
# tokenizer.json, AutoTokenizer and SGLang in agreement for every arch.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML-like: each turn is wrapped in <|im_start|>role\n ... <|im_end|>\n; the assistant's
# turn ends with <|im_end|>, which is therefore also a generation stop token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2.5's layout in miniature: tools listed in the system turn, calls as hermes <tool_call>
# blocks, tool results as a user turn in <tool_response>. The assistant's generation prompt is
# the start of its rendered turn, so a turn the model ended with <|im_end|> re-renders as it was
# generated — the property token-exact trajectory capture relies on.
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' "
    "+ (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT_TEMPLATES = {"plain": CHAT_TEMPLATE, "tools": TOOL_CHAT_TEMPLATE}

_CHAT_WORDS = (
    "system user assistant you are a helpful math solver answer question think step by step "
    "the result is final equals plus minus times divided numbers use each number once create "
    "an equation that equals correct wrong yes no please show your work in <answer> </answer> "
    "tags tool call output observation good great let me check again"
).split()


@dataclass
class TinyModelSpec:
    """Shape of the tiny model; defaults keep generation fast on 2 CPU cores."""

    arch: str = "qwen2"
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = False
    seed: int = 0
    num_experts: int = 8  # qwen3_moe only: routed experts per layer
    num_experts_per_tok: int = 2  # qwen3_moe only: top-k
    head_dim: int = 0  # qwen3 / qwen3_moe: per-head width; 0: hidden_size // num_attention_heads (Qwen3-30B-A3B: 128)

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"--arch must be one of {ARCHS}, got {self.arch!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"--hidden-size ({self.hidden_size}) must be divisible by "
                f"--num-attention-heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"--num-attention-heads ({self.num_attention_heads}) must be divisible by "
                f"--num-key-value-heads ({self.num_key_value_heads})"
            )
        if self.arch == "qwen3_moe" and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"--num-experts-per-tok ({self.num_experts_per_tok}) must be in 1..--num-experts "
                             f"({self.num_experts})")
        if self.head_dim < 0:
            raise ValueError(f"--head-dim must be >= 0 (0: hidden size / heads), got {self.head_dim}")
        if self.vocab_size < 300:
            # 256 byte symbols + specials must fit before any merge is learned.
            raise ValueError(f"--vocab-size must be at least 300, got {self.vocab_size}")


def generate_corpus(seed: int, num_lines: int = 4000) -> list[str]:
    """Arithmetic, countdown-like and chat-flavoured lines, deterministic for a seed."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        kind = rng.randrange(4)
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        if kind == 0:
            op = rng.choice("+-*")
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            lines.append(f"What is {a} {op} {b}? The answer is {value}.")
        elif kind == 1:
            nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
            target = rng.randint(1, 200)
            lines.append(
                f"Using the numbers {nums}, create an equation that equals {target}. "
                f"<answer> {nums[0]} + {nums[1]} </answer>"
            )
        elif kind == 2:
            lines.append(" ".join(rng.choice(_CHAT_WORDS) for _ in range(rng.randint(5, 15))))
        else:
            lines.append(f"{a}+{b}={a + b}\n{a}-{b}={a - b}")
    return lines


def train_tokenizer(vocab_size: int, seed: int, corpus: Sequence[str] | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE with single-digit pre-tokenization, wrapped for transformers.

    ``corpus`` (lines of text) replaces the generated one, so a task's own text — code, tags,
    tool output — gets merges of its own; byte-level BPE still encodes any text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) if corpus is not None else generate_corpus(seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _head_dim(spec: TinyModelSpec) -> int:
    return spec.head_dim or spec.hidden_size // spec.num_attention_heads


def _model_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-6,
        dtype="float32",
    )
    if spec.arch == "qwen2":
        return Qwen2Config(**common)  # q/k/v projections carry a bias in Qwen2
    if spec.arch == "qwen3":
        # Qwen3 drops the qkv bias and adds RMSNorm on q and k per head.
        return Qwen3Config(head_dim=_head_dim(spec), **common)
    if spec.arch == "qwen3_moe":
        # Qwen3's attention; every layer sparse, each expert half the dense MLP's width, top-k
        # probabilities renormalised (as Qwen3-30B-A3B).
        return Qwen3MoeConfig(head_dim=_head_dim(spec), num_experts=spec.num_experts,
                              num_experts_per_tok=spec.num_experts_per_tok,
                              moe_intermediate_size=spec.intermediate_size // 2, norm_topk_prob=True, **common)
    return LlamaConfig(**common)


def build_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    corpus: Sequence[str] | None = None,
    num_experts: int = 8,
    num_experts_per_tok: int = 2,
    chat_template: str = "plain",
    head_dim: int = 0,
) -> Path:
    """Write a random-init HF causal LM (safetensors) and its tokenizer to `out_dir`."""
    spec = TinyModelSpec(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        seed=seed,
        num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok,
        head_dim=head_dim,
    )
    spec.validate()
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATES)}, got {chat_template!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(spec.vocab_size, spec.seed, corpus)
    tokenizer.chat_template = CHAT_TEMPLATES[chat_template]
    if len(tokenizer) > spec.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than --vocab-size {spec.vocab_size}")
    config = _model_config(spec, tokenizer)

    import torch
    from transformers import AutoModelForCausalLM

    # Seed a private generator state so building a model does not disturb the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Chat turns end with <|im_end|>; raw text ends with <|eos|>. Both stop generation.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def set_chat_template(model_dir: str | Path, template: str) -> Path:
    """Replace the chat template of the tokenizer saved in ``model_dir``."""
    model_dir = Path(model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    template_file = model_dir / "chat_template.jinja"  # newer transformers save it here instead
    if template_file.exists():
        template_file.write_text(template)
    return model_dir


def main(argv: list[str] | None = None) -> int:
    defaults = TinyModelSpec()
    parser = argparse.ArgumentParser(
        prog="python -m examples.models.tiny",
        description="Write a tiny random-init HF causal LM and a locally trained tokenizer.",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--arch", choices=ARCHS, default=defaults.arch)
    for field, value in asdict(defaults).items():
        if field in ("arch", "tie_word_embeddings"):
            continue
        parser.add_argument("--" + field.replace("_", "-"), type=int, default=value)
    parser.add_argument("--tie-word-embeddings", action="store_true")
    parser.add_argument("--corpus", type=Path, help="train the tokenizer on this text file's lines instead of the built-in corpus")
    parser.add_argument("--no-merges", action="store_true",
                        help="learn no BPE merges: every character is one token, as every digit is (for a task "
                             "that works letter by letter, e.g. spelling a word backward)")
    parser.add_argument("--chat-template", choices=tuple(CHAT_TEMPLATES), default="plain",
                        help="plain: ChatML turns; tools: also tools and hermes <tool_call> blocks (for the router front)")
    args = parser.parse_args(argv)
    corpus = None
    if args.no_merges and args.corpus is not None:
        parser.error("--no-merges and --corpus exclude each other (--no-merges trains on no text)")
    if args.no_merges:
        corpus = []  # nothing to count pairs in: the vocabulary is the 256 bytes and the special tokens
    if args.corpus is not None:
        try:
            corpus = args.corpus.read_text().splitlines()
        except OSError as exc:
            parser.error(f"--corpus: cannot read {args.corpus}: {exc.strerror}")
    try:
        path = build_tiny_model(
            args.out,
            arch=args.arch,
            vocab_size=args.vocab_size,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            intermediate_size=args.intermediate_size,
            max_position_embeddings=args.max_position_embeddings,
            tie_word_embeddings=args.tie_word_embeddings,
            seed=args.seed,
            corpus=corpus,
            num_experts=args.num_experts,
            num_experts_per_tok=args.num_experts_per_tok,
            chat_template=args.chat_template,
            head_dim=args.head_dim,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
