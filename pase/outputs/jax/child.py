"""The child process of ``verify``: read the pickled network and plan on stdin, run the plan
with jax (``program``), write the numbers, timings and collectives as JSON on stdout.

``python3 -m pase.outputs.jax.child``; jax is imported here only, never in the parent.
"""

import json
import pickle
import sys

from .hlo import parse_collectives


def main() -> int:
    payload = pickle.loads(sys.stdin.buffer.read())
    from pase.outputs.jax import program as jax_program  # imports jax

    out = jax_program.run(payload["network"], payload["shardings"], payload["seed"], payload["dtype"])
    out["collectives"] = [c.__dict__ for c in parse_collectives(out.pop("hlo"), payload["shardings"]["procs"])]
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
