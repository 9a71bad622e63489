"""Model runner of the CPU engine: forward passes, sampling, logprobs and weight loading.

It holds an HF-format causal LM loaded through transformers and knows nothing of requests,
queues or HTTP. The scheduler hands it token ids and per-sequence KV caches.

KV caches are per sequence: a list over layers of (keys, values), each shaped
[1, num_kv_heads, seq_len, head_dim]. They are never modified in place (every append makes
a new tensor), so a cache slice handed to the prefix cache stays valid while the sequence
goes on decoding.

Logprob convention (matches SGLang's sampler, checked against sglang/srt/layers/sampler.py
and sampling_params.py): the reported logprob of a sampled token is
    log_softmax(logits / temperature)[token]
over the full vocabulary, i.e. before top-k / top-p truncation and renormalisation.
SGLang turns temperature < 1e-6 into greedy decoding by setting temperature = 1 and
top_k = 1, so at temperature 0 the logprob is log_softmax(logits)[argmax].
A given (input) token's logprob, SGLang's ``input_token_logprobs``, is log_softmax(logits)[token]
whatever the request's temperature: SGLang's logits processor normalises input logprobs "w/o
temperature, top-p" (the scaling there is gated by a flag /generate never sets).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from actors.engine.cpu.checkpoint_layout import Slot, UnsupportedLayout, checkpoint_layout
from actors.engine.cpu.config import ModelDirError, check_model_dir
from actors.engine.cpu.routed_experts import ExpertCapture, RoutedKV, join, kv_experts
from slime_async.dtypes import dtype_from_name

# A sequence's cache: one (keys, values) pair per layer, each [1, kv_heads, len, head_dim].
SequenceKV = list[tuple[torch.Tensor, torch.Tensor]]

GREEDY_EPS = 1e-6  # SGLang's _SAMPLING_EPS: temperatures below it mean greedy


class WeightUpdateError(ValueError):
    """A weight update was rejected; the weights in use are unchanged."""


@dataclass(frozen=True)
class SamplingSpec:
    """What the runner needs to pick one token for one sequence."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    generator: torch.Generator | None = None
    top_logprobs_num: int = 0  # also report this many most likely tokens of the same distribution


def kv_length(kv: SequenceKV | None) -> int:
    return 0 if not kv else kv[0][0].shape[2]


def slice_kv(kv: SequenceKV, length: int) -> SequenceKV:
    """The first `length` positions of a cache (views; safe because caches are immutable), with
    their routed experts when it carries them."""
    experts = kv_experts(kv)
    return RoutedKV.of([(k[:, :, :length], v[:, :, :length]) for k, v in kv],
                       None if experts is None else experts[:length])


def filter_top_k_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero all but the ``top_k`` most likely tokens (exactly k, ties or not, as SGLang keeps), then
    all but the smallest set whose mass reaches ``top_p``; the rest is not renormalised."""
    if 0 < top_k < probs.numel():
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[torch.topk(probs, top_k).indices] = True
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=0) / sorted_probs.sum()
        # Keep every token whose preceding mass is below top_p (the first always stays).
        drop = (cumulative - sorted_probs / sorted_probs.sum()) > top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs


class ModelRunner:
    """Loads a causal LM on CPU and runs prefill / batched decode / sampling."""

    def __init__(self, model_path: str | Path, dtype: torch.dtype = torch.float32, seed: int = 0,
                 capture_routed_experts: bool = False) -> None:
        self.model_path = str(check_model_dir(model_path))
        self.dtype = dtype
        try:
            self.config = AutoConfig.from_pretrained(self.model_path)
            self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype, attn_implementation="sdpa")
        except (OSError, ValueError, KeyError) as exc:
            raise ModelDirError(f"cannot load model from {self.model_path!r}: {exc}") from exc
        self.model.eval().requires_grad_(False)
        self.vocab_size: int = self.config.vocab_size
        self.context_len: int = getattr(self.config, "max_position_embeddings", 4096)
        self.eos_token_ids: frozenset[int] = self._eos_token_ids()
        self.generator = torch.Generator().manual_seed(seed)
        # --enable-return-routed-experts: each forward's top-k expert ids per MoE layer ride with the KV.
        try:
            self.capture = ExpertCapture(self.model) if capture_routed_experts else None
            # Weights by checkpoint name (per expert), each a slot in a parameter or persistent buffer.
            self._layout: dict[str, Slot] = checkpoint_layout(self.model)
        except (ValueError, UnsupportedLayout) as exc:
            raise ModelDirError(f"model {self.model_path!r}: {exc}") from exc
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self._tensors = {**dict(self.model.named_buffers()), **self._params}  # owner name -> tensor
        self._param_shapes = {name: param.shape for name, param in self._params.items()}
        # Whether the weights' memory is released (SGLang's "weights" tag), and the checkpoint
        # names not loaded since it was resumed: the model can serve again once every one is.
        self._released = False
        self._unloaded: set[str] = set()

    def _eos_token_ids(self) -> frozenset[int]:
        # Like SGLang, stop on the config's eos ids and the generation config's.
        ids: set[int] = set()
        for source in (self.config.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return frozenset(ids)

    # ---- forward -------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, token_ids: list[int], prefix: SequenceKV | None,
                all_positions: bool = False) -> tuple[torch.Tensor, SequenceKV]:
        """Run the tokens after a cached prefix; return the last position's logits [vocab] (or,
        ``all_positions``, every new position's [n_new, vocab]) and the full cache (with the
        routed experts of every position when they are captured)."""
        start = kv_length(prefix)
        new = token_ids[start:]
        if not new:
            raise ValueError("prefill needs at least one token beyond the cached prefix")
        cache = DynamicCache(ddp_cache_data=prefix) if prefix else DynamicCache()
        ids = torch.tensor([new], dtype=torch.long)
        positions = torch.arange(start, start + len(new), dtype=torch.long).unsqueeze(0)
        if self.capture is not None:
            self.capture.begin()
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
        experts = None
        if self.capture is not None:
            experts = join(kv_experts(prefix), start, self.capture.rows(len(new)))
        kv = RoutedKV.of([(layer.keys, layer.values) for layer in out.past_key_values.layers], experts)
        return (out.logits[0].float() if all_positions else out.logits[0, -1].float()), kv

    @torch.inference_mode()
    def decode(self, last_tokens: list[int], caches: list[SequenceKV]) -> tuple[torch.Tensor, list[SequenceKV]]:
        """One decode step for a batch of sequences of different lengths.

        The per-sequence caches are left-padded to the longest one and masked, so one
        forward serves the whole running batch; each sequence then gets its own cache back
        with the new position appended.
        """
        batch = len(last_tokens)
        lengths = [kv_length(kv) for kv in caches]
        longest = max(lengths)
        if all(n == longest for n in lengths):
            layers = [
                (torch.cat([kv[i][0] for kv in caches]), torch.cat([kv[i][1] for kv in caches]))
                for i in range(len(caches[0]))
            ]
            mask = None
        else:
            layers = []
            for i in range(len(caches[0])):
                k0 = caches[0][i][0]
                keys = k0.new_zeros((batch, k0.shape[1], longest, k0.shape[3]))
                values = torch.zeros_like(keys)
                for b, kv in enumerate(caches):
                    keys[b, :, longest - lengths[b] :] = kv[i][0][0]
                    values[b, :, longest - lengths[b] :] = kv[i][1][0]
                layers.append((keys, values))
            # 0 over each row's left padding, 1 over its real positions and the new token.
            mask = torch.ones((batch, longest + 1), dtype=torch.long)
            for b, n in enumerate(lengths):
                mask[b, : longest - n] = 0
        cache = DynamicCache(ddp_cache_data=layers)
        ids = torch.tensor(last_tokens, dtype=torch.long).unsqueeze(1)
        positions = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
        if self.capture is not None:
            self.capture.begin()
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        rows = self.capture.rows(batch) if self.capture is not None else None
        new_kv = []
        for b, kv in enumerate(caches):
            seq = []
            for i, layer in enumerate(out.past_key_values.layers):
                k_new = layer.keys[b : b + 1, :, -1:]
                v_new = layer.values[b : b + 1, :, -1:]
                seq.append((torch.cat([kv[i][0], k_new], dim=2), torch.cat([kv[i][1], v_new], dim=2)))
            new_kv.append(RoutedKV.of(seq, None if rows is None else join(kv_experts(kv), lengths[b], rows[b : b + 1])))
        return out.logits[:, -1].float(), new_kv

    # ---- sampling ------------------------------------------------------------------

    def sample(self, logits: torch.Tensor, specs: list[SamplingSpec]
               ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
        """Pick one token per row of `logits` [batch, vocab]; return tokens, their logprobs, and
        per row the ``top_logprobs_num`` most likely (logprob, token) of the same log-softmax,
        most likely first (SGLang's ``get_top_logprobs``: a top-k of the logprobs it reports)."""
        tokens, logprobs, tops = [], [], []
        for row, spec in zip(logits, specs):
            greedy = spec.temperature < GREEDY_EPS or spec.top_k == 1
            temperature = 1.0 if spec.temperature < GREEDY_EPS else spec.temperature
            log_probs = torch.log_softmax(row / temperature, dim=-1)
            if greedy:
                token = int(torch.argmax(row))
            else:
                token = self._draw(log_probs, spec)
            tokens.append(token)
            logprobs.append(float(log_probs[token]))
            top: list[tuple[float, int]] = []
            if spec.top_logprobs_num > 0:
                values, ids = torch.topk(log_probs, min(spec.top_logprobs_num, log_probs.numel()))
                top = list(zip(values.tolist(), ids.tolist()))
            tops.append(top)
        return tokens, logprobs, tops

    @staticmethod
    def token_logprobs(logits: torch.Tensor, targets: list[int], temperature: float = 1.0) -> list[float]:
        """Logprob of each given token under the row before it: log_softmax(logits / temperature),
        temperature 1 when greedy (a sampled token's convention). Prompt scoring (SGLang's
        ``input_token_logprobs``) uses temperature 1 whatever the request's (module docstring)."""
        if not targets:
            return []
        temperature = 1.0 if temperature < GREEDY_EPS else temperature
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        picked = log_probs.gather(1, torch.tensor(targets, dtype=torch.long).unsqueeze(1))
        return [float(v) for v in picked.squeeze(1)]

    def _draw(self, log_probs: torch.Tensor, spec: SamplingSpec) -> int:
        probs = filter_top_k_top_p(log_probs.exp(), spec.top_k, spec.top_p)
        generator = spec.generator or self.generator
        return int(torch.multinomial(probs, 1, generator=generator))

    # ---- weights -------------------------------------------------------------------

    def parameter_names(self) -> list[str]:
        """The weights' checkpoint names (per expert for MoE layers; checkpoint_layout.py)."""
        return list(self._layout)

    def stage_from_disk(self, model_path: str) -> dict[str, torch.Tensor]:
        """Read and validate a whole checkpoint; nothing is applied yet."""
        try:
            path = check_model_dir(model_path)
        except ModelDirError as exc:
            raise WeightUpdateError(str(exc)) from exc
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise WeightUpdateError(f"model path {model_path!r} has no *.safetensors files")
        staged: dict[str, torch.Tensor] = {}
        for file in files:
            try:
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():
                        staged[name] = handle.get_tensor(name)
            except Exception as exc:  # safetensors raises its own error types
                raise WeightUpdateError(f"cannot read {str(file)!r}: {exc}") from exc
        return self.stage(staged, f"checkpoint {model_path!r}")

    def stage(self, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
        """Check a whole state dict against the served model and cast it to its dtype (a new
        dict; ``tensors`` is left as it is)."""
        staged: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            self._check_tensor(name, tensor.shape, tensor.dtype, exact_dtype=False, source=source)
            staged[name] = tensor.to(self._owner(name).dtype)
        missing = [n for n in self._layout if n not in staged and not self._is_tied_alias(n, staged)]
        if missing:
            raise WeightUpdateError(
                f"{source} lacks {len(missing)} parameter(s) of the served model, e.g. {missing[:3]}"
            )
        return staged

    def served(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The model's current tensors under these checkpoint names (views, not copies)."""
        return {name: self._target(name).detach() for name in names}

    def check_distributed_spec(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> None:
        """Validate a broadcast announcement (names, dtypes, shapes) before receiving."""
        if not len(names) == len(dtypes) == len(shapes):
            raise WeightUpdateError(
                f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, {len(shapes)})"
            )
        for name, dtype, shape in zip(names, dtypes, shapes):
            self._check_tensor(name, torch.Size(shape), dtype_from_name(dtype, WeightUpdateError), exact_dtype=True,
                               source="broadcast")

    @staticmethod
    def receive_buffers(dtypes: list[str], shapes: list[list[int]]) -> list[torch.Tensor]:
        """Empty tensors shaped as announced, to receive a broadcast into."""
        return [torch.empty(shape, dtype=dtype_from_name(dtype, WeightUpdateError))
                for dtype, shape in zip(dtypes, shapes)]

    @torch.no_grad()
    def apply_weights(self, staged: dict[str, torch.Tensor]) -> None:
        """Copy validated tensors into the model (tied weights share storage, so one copy does)."""
        if self._released:
            raise WeightUpdateError("the weights' memory is released: POST /resume_memory_occupation first")
        for name, tensor in staged.items():
            self._target(name).copy_(tensor)
        # A tied alias loads its slot too (the set holds one name per slot).
        loaded = {self._slot_key(name) for name in staged}
        self._unloaded = {name for name in self._unloaded if self._slot_key(name) not in loaded}

    # ---- memory occupation (colocated training) --------------------------------------

    def weight_bytes(self) -> int:
        """Bytes the weights occupy now (tied weights once)."""
        return sum(p.numel() * p.element_size() for p in self._unique_params().values())

    def release_weights(self) -> int:
        """Free the parameters' memory (SGLang's release of the "weights" tag); returns the bytes
        freed. Shapes are kept so that updates can be checked while released."""
        freed = self.weight_bytes()
        for param in self._unique_params().values():
            param.data = torch.empty(0, dtype=param.dtype)
        self._released = True
        slots = {self._slot_key(name): name for name in self._layout if self._layout[name].owner in self._params}
        self._unloaded = set(slots.values())
        return freed

    def resume_weights(self) -> None:
        """Allocate the weights again; their values are undefined until every tensor is loaded."""
        assert self._released, "resume_weights without release_weights"
        for name, param in self._unique_params().items():
            param.data = torch.zeros(self._param_shapes[name], dtype=param.dtype)
        self._released = False

    @property
    def can_serve(self) -> bool:
        """Whether every weight is allocated and loaded (checked before each admission)."""
        return not self._released and not self._unloaded

    def unloaded_weights(self) -> list[str]:
        """Weights not loaded since the memory was resumed (empty when the model can serve)."""
        return sorted(self._unloaded)

    def stage_partial(self, named: list[tuple[str, torch.Tensor]], source: str) -> dict[str, torch.Tensor]:
        """Check some of the model's tensors (one bucket) and cast them to its dtype; nothing applied."""
        staged: dict[str, torch.Tensor] = {}
        for name, tensor in named:
            self._check_tensor(name, tensor.shape, tensor.dtype, exact_dtype=False, source=source)
            staged[name] = tensor.to(self._owner(name).dtype)
        return staged

    def _unique_params(self) -> dict[str, torch.nn.Parameter]:
        """One name per parameter object (tied weights share one)."""
        seen: dict[int, str] = {}
        for name, param in self._params.items():
            seen.setdefault(id(param), name)
        return {name: self._params[name] for name in seen.values()}

    def _owner(self, name: str) -> torch.Tensor:
        return self._tensors[self._layout[name].owner]

    def _target(self, name: str) -> torch.Tensor:
        """The tensor a checkpoint name loads into: its parameter or buffer, or a view of its slot."""
        slot = self._layout[name]
        owner = self._tensors[slot.owner]
        return owner if slot.index is None else owner[slot.index]

    def _slot_key(self, name: str) -> tuple[int, str]:
        """Equal for names that load the same memory (tied weights)."""
        slot = self._layout[name]
        return id(self._tensors[slot.owner]), repr(slot.index)

    def _is_tied_alias(self, name: str, staged: dict[str, torch.Tensor]) -> bool:
        key = self._slot_key(name)
        return any(other in staged and self._slot_key(other) == key for other in self._layout)

    def _check_tensor(self, name: str, shape: torch.Size, dtype: torch.dtype, exact_dtype: bool, source: str) -> None:
        slot = self._layout.get(name)
        if slot is None:
            raise WeightUpdateError(f"{source}: unknown parameter name {name!r} for this model")
        if tuple(shape) != tuple(slot.shape):
            raise WeightUpdateError(
                f"{source}: shape mismatch for {name!r}: got {list(shape)}, model has {list(slot.shape)}"
            )
        expected_dtype = self._owner(name).dtype
        if exact_dtype and dtype != expected_dtype:
            # SGLang also refuses a broadcast whose dtype differs from the served model's.
            raise WeightUpdateError(f"{source}: dtype mismatch for {name!r}: got {dtype}, model has {expected_dtype}")
        if not dtype.is_floating_point:
            raise WeightUpdateError(f"{source}: {name!r} has non-floating dtype {dtype}")
