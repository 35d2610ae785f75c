"""The child process of ``offline.compile_jobs``: compile each job with its ISA dumped to
``<dump>/<job index>/<kernel>/``. Run only through ``offline``, which sets the environment."""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    import flydsl.compiler as flyc

    for i, job in enumerate(spec["jobs"]):
        print(f"MONO-JOB {i} {job['builder']}", flush=True)
        os.environ["FLYDSL_DUMP_DIR"] = os.path.join(spec["dump"], str(i))
        module, func = job["builder"].split(":")
        launch, args = getattr(importlib.import_module(module), func)(**job["kwargs"])
        flyc.compile(launch, *args)


if __name__ == "__main__":
    main(sys.argv[1])
