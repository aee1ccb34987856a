"""The OptiML language server (pygls): spec and nvcc diagnostics, static feedback as inlay hints
and hover, "Add OptiML spec" for `.cu`/`.cuh` files, and optimize and profile jobs whose results
come back as proposals (code lenses), hover and diagnostics. It uses `optiml`'s public API; only
`check_job` reaches below it, for want of `optiml.api.check_source`, and `jobs` for the cache
folder."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.jobs import ExecutorFactory


SWITCH_INTERVAL_S = 0.0005


def main(argv: list[str] | None = None, executor_factory: ExecutorFactory | None = None) -> int:
    """`optiml serve`: LSP over stdin/stdout, or over TCP on 127.0.0.1 for debugging."""
    parser = argparse.ArgumentParser(prog="optiml serve", description=main.__doc__)
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (default)")
    transport.add_argument("--tcp", type=int, metavar="PORT", help="listen on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    # stderr only: stdout carries the protocol
    logging.basicConfig(
        level=logging.WARNING, format="optiml-server %(levelname)s %(name)s: %(message)s"
    )

    from server.app import make_server  # not at import: `import server` stays cheap

    server = make_server(executor_factory)
    # Everything imported so far lives as long as the server: frozen, it is not walked by every
    # full collection, which on a parse thread would otherwise stall the event loop for ~50 ms.
    gc.freeze()
    # Parses run on a thread: a request on the event loop waits for the interpreter lock at most
    # this long (Python's default is 5 ms, half a request's 10 ms budget, several times a request).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if args.tcp is not None:
        server.start_tcp("127.0.0.1", args.tcp)
    else:
        server.start_io()
    return server.exit_code
