"""The one switch that turns mono's decode on: ``--additional-config '{"mono_decode": true}'``.

vLLM 0.33 already reads ``decode_backend`` from ``additional_config`` and rejects any value
but ``auto`` / ``latency_specialized`` (its own Kimi-K3 and DeepSeek specialized decodes),
and reads ``kda_decode_backend``, ``kda_spec_decode_backend``, ``kda_prefill_backend``,
``gdn_prefill_backend``, ``kda_prefill_checkpoint`` and ``mla_core``. A key of our own,
``mono_decode``, cannot collide with any of them nor make vLLM's checks raise.
"""

from __future__ import annotations

from typing import Any

SWITCH = "mono_decode"


def requested(additional_config: Any) -> bool:
    """True when the deployment asks for mono's decode; a malformed value raises."""
    if not isinstance(additional_config, dict) or SWITCH not in additional_config:
        return False
    value = additional_config[SWITCH]
    if not isinstance(value, bool):
        raise ValueError(f"additional_config {SWITCH!r} must be true or false, got {value!r}")
    return value
