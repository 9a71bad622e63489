"""Embedded CPU inference engine speaking SGLang's HTTP API.

Modules, from the outside in:
  server.py        aiohttp routes (SGLang's endpoints) and `main`; `python -m actors.engine.cpu`
  weights.py       the weight-update and memory-occupation routes (a part of the server)
  http_json.py     JSON bodies in and out of the routes
  protocol.py      /generate wire format: request parsing/validation, response shaping
  preconditions.py what SGLang's scheduler dies on: refused (counted), or the process exits (strict)
  scheduler.py     continuous batching on a dedicated thread; abort, pause, weight swap
  prefix_cache.py  LRU cache of finished sequences' KV for multi-turn / group prompts
  model_runner.py  transformers model: prefill, batched decode, sampling, weight staging
  config.py        command line and start-up checks (no heavy imports)
  local.py         start/stop it as a local subprocess (benchmarks and tests)
"""
