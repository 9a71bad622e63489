"""The ideal episode of a calculator row (the warm start's target; not part of the env): one
call with the quoted expression, the tool's output, the value as the answer."""

from __future__ import annotations

import json
from typing import Any


def episode(row: dict[str, Any]) -> list[dict[str, Any]]:
    expression = row["question"].split('"')[1]
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": row["answer"]},
            {"role": "assistant", "content": row["answer"]}]
