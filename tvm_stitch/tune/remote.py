"""Candidates timed on other GPUs through TVM's RPC servers (issue 48, item 5).

A tuning server is TVM's own RPC server (``tvm.rpc.Server``) with :data:`FUNCTION` registered
in it, one per GPU (``CUDA_VISIBLE_DEVICES`` picks it), on this host or on others::

    CUDA_VISIBLE_DEVICES=1 python -m tvm_stitch.tune.remote --port 9190 [--tracker HOST:PORT]

A compile told of servers (``TVM_STITCH_RPC``, :func:`connect`) runs its measured searches side
by side (:meth:`~tvm_stitch.tune.policy.KernelTuner.prefetch`), each on one device: this
process's GPU or a server's. A search on a server sends each batch of candidates — the
kernel's generated text, its match, the shapes and the launch configs, pickled — and receives
their timings; the server compiles and times them as a search here would
(:func:`time_candidates`). The cost model, the tuning database and every choice stay in the
compiling process, so the database holds each measurement, whichever GPU took it.

A server runs what a compile sends it, as every TVM RPC server does: serve trusted networks
only. TVM's tracker (``python -m tvm.exec.rpc_tracker``) needs ``tornado``; servers named
directly do not.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import threading
import time

from .measure import TURNS, timing_device, timing_on

logger = logging.getLogger("tvm_stitch.tune")

#: the global function a tuning server registers (:func:`time_candidates`)
FUNCTION = "tvm_stitch.time_candidates"
#: the key servers register with a tracker under, and a compile requests
DEFAULT_KEY = "tvm-stitch"
#: seconds a server or tracker has to take a connection
CONNECT_TIMEOUT = 5.0

def time_candidates(payload) -> bytearray:
    """On a tuning server: the seconds of each launch config of a generated kernel, compiled
    side by side and timed on this server's GPU as a local search times them; a config that
    fails gives its error's text instead.

    The work runs in one process spawned for this connection and kept (:func:`_timer`): TVM's
    server serves each connection in a process forked from its listening one, where CUDA
    cannot start once the listener has touched it ("Cannot re-initialize CUDA in forked
    subprocess").

    Parameters
    ----------
    payload : bytes
        ``(match, source, shapes, constants, hw, configs)`` pickled
        (:meth:`RemoteDevice.time`).

    Returns
    -------
    bytearray
        The list of seconds (or error texts), pickled.
    """
    import concurrent.futures

    from tvm_stitch.tune.remote import _time_here  # by its module's name, not __main__'s

    try:
        return bytearray(_timer().submit(_time_here, bytes(payload)).result())
    except concurrent.futures.process.BrokenProcessPool:
        _TIMER.clear()  # the timing process died (a kernel that crashed it): a new one next
        raise


_TIMER = []  # the process timing this connection's candidates (:func:`_timer`)


def _timer():
    """This connection's timing process: spawned at its first batch, a fresh interpreter."""
    if not _TIMER:
        import concurrent.futures
        import multiprocessing

        _TIMER.append(concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")))
    return _TIMER[0]


def _time_here(payload: bytes) -> bytes:
    """:func:`time_candidates`' work, in the process that times (:func:`_timer`)."""
    from .kernels import generated_runner
    from .measure import time_candidate

    match, source, shapes, constants, hw, configs = pickle.loads(payload)
    run = generated_runner(match, source, shapes, constants, hw)
    run.prepare(configs)
    out = []
    for config in configs:
        try:
            out.append(time_candidate(run(config)))
        except Exception as err:  # noqa: BLE001 - any: the search records the failure
            out.append(f"{type(err).__name__}: {err}")
    return pickle.dumps(out)


def register() -> None:
    """Register :data:`FUNCTION` in this process (a tuning server's start)."""
    import tvm_ffi

    tvm_ffi.register_global_func(FUNCTION, time_candidates, override=True)


class RemoteDevice:
    """A tuning server's GPU, through one RPC session: one batch of candidates at a time.

    Parameters
    ----------
    session : tvm.rpc.RPCSession
        The session (:func:`connect`).
    name : str
        Where it is (``host:port``), for the logs.
    """

    def __init__(self, session, name: str):
        self.session, self.name = session, name
        self.function = session.get_function(FUNCTION)
        self.lock = threading.Lock()
        self.batches = self.timed = 0

    def time(self, match, source, shapes, constants, hw, configs) -> list:
        """Seconds of each of ``configs`` (or its error's text), timed on the server. The
        caller's turn (:data:`~tvm_stitch.tune.measure.TURNS`) is given up meanwhile."""
        payload = bytearray(pickle.dumps((match, source, shapes, constants, hw, list(configs))))
        with TURNS.waiting(), self.lock:
            out = self.function(payload)
            self.batches += 1
            self.timed += len(configs)
        return pickle.loads(bytes(out))

    def __repr__(self) -> str:
        return f"RemoteDevice({self.name})"


def connect(spec: str | None = None) -> list[RemoteDevice]:
    """Sessions to the tuning servers ``spec`` names (default ``$TVM_STITCH_RPC``): items
    separated by commas, each ``HOST:PORT[/KEY]`` (a server) or ``tracker=HOST:PORT[/KEY][*N]``
    (``N`` sessions, default 1, of servers registered with TVM's tracker), ``KEY`` the servers'
    (default :data:`DEFAULT_KEY`). One that cannot be reached is left out, with a warning.

    Returns
    -------
    list of RemoteDevice
    """
    from tvm import rpc

    spec = os.environ.get("TVM_STITCH_RPC", "") if spec is None else spec
    devices = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            if item.startswith("tracker="):
                address, _, count = item[len("tracker="):].partition("*")
                address, _, key = address.partition("/")
                host, port = _address(address)
                tracker = rpc.connect_tracker(host, port)
                for _ in range(int(count or 1)):
                    session = tracker.request(key or DEFAULT_KEY, session_timeout=0)
                    devices.append(RemoteDevice(session, f"{key or DEFAULT_KEY}@{address}"))
            else:
                address, _, key = item.partition("/")
                host, port = _address(address)
                devices.append(RemoteDevice(rpc.connect(host, port, key=key or DEFAULT_KEY),
                                            address))
        except Exception as err:  # noqa: BLE001 - any: that server's candidates are timed here
            logger.warning("tuning server %s not used: %s: %s", item, type(err).__name__, err)
    if devices:
        logger.info("tuning servers: %s", ", ".join(d.name for d in devices))
    return devices


def _address(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT``, which must take a connection within
    :data:`CONNECT_TIMEOUT` seconds (TVM's own connect retries for a minute)."""
    import socket

    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT):
        pass
    return host, int(port)



#: the server this thread's searches time on (None: this process's GPU), and the ``with``
#: block that sets it (:func:`~tvm_stitch.tune.measure.timing_device`)
current, using = timing_device, timing_on


def serve(host: str = "0.0.0.0", port: int = 9190, port_end: int | None = None,
          tracker: str | None = None, key: str = DEFAULT_KEY, init=register):
    """Start a tuning server: TVM's RPC server with ``init`` run in its process first
    (:func:`register`). Returns the ``tvm.rpc.Server`` (its ``port`` the one bound)."""
    from tvm import rpc

    return rpc.Server(host, port, port_end=port_end or port + 100,
                      tracker_addr=_address(tracker) if tracker else None, key=key,
                      server_init_callback=init)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tvm_stitch.tune.remote",
        description="A tuning server: times tvm-stitch's candidates on this GPU for compiles "
                    "elsewhere (TVM_STITCH_RPC=HOST:PORT there).")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9190)
    parser.add_argument("--port-end", type=int, default=None)
    parser.add_argument("--tracker", default=None, help="HOST:PORT of TVM's RPC tracker")
    parser.add_argument("--key", default=DEFAULT_KEY)
    args = parser.parse_args(argv)
    server = serve(args.host, args.port, args.port_end, args.tracker, args.key)
    print(f"tuning server on {args.host}:{server.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())
