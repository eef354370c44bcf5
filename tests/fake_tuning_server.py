"""A tuning server for tests on a machine without a GPU: TVM's RPC server
(``tvm_stitch.tune.remote.serve``) whose ``tvm_stitch.time_candidates`` gives each config the
seconds :func:`fake_seconds` says instead of timing it, and writes the count of configs it was
sent to ``COUNT`` (a file). Prints ``port N`` once serving.

    python tests/fake_tuning_server.py PORT COUNT
"""

from __future__ import annotations

import sys
import time


def fake_seconds(config: dict) -> float:
    """A made-up time, lowest for 64-row tiles and more warps; a split of k fails."""
    if config.get("SPLIT_K", 1) > 1:
        return "RuntimeError: no split here"
    return 1e-6 * (abs(config.get("BLOCK_M", 0) - 64) + config.get("BLOCK_N", 0) / 16
                   + 8 / config.get("num_warps", 4) + config.get("num_stages", 3))


def main(port: int, count: str) -> None:
    from tvm_stitch.tune import remote

    def register():  # in the server's process (pickled by value: defined in __main__)
        import pickle

        import tvm_ffi

        def time_candidates(payload):
            *_, configs = pickle.loads(bytes(payload))
            with open(count, "a") as f:
                f.write(f"{len(configs)}\n")
            return bytearray(pickle.dumps([fake_seconds(c) for c in configs]))

        tvm_ffi.register_global_func(remote.FUNCTION, time_candidates, override=True)

    server = remote.serve("127.0.0.1", port, port + 50, init=register)
    print(f"port {server.port}", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
