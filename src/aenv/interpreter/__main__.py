"""`python3 -m aenv.interpreter [--host H] [--port N] [--cwd DIR]`: serve until stopped.

The template's start command runs this inside the sandbox (0.0.0.0:49999, contexts in
/home/user); the tests run it on the host on a free port with a scratch cwd.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from aenv.interpreter import DEFAULT_PORT
from aenv.interpreter.app import create_app
from aenv.interpreter.contexts import DEFAULT_CWD


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m aenv.interpreter",
                                     description="E2B-compatible code-interpreter server")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to bind (default {DEFAULT_PORT})")
    parser.add_argument("--cwd", default=DEFAULT_CWD,
                        help=f"cwd of contexts that name none (default {DEFAULT_CWD})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # No keep-alive timeout shorter than a client's think time: the SDK opens a connection per
    # call anyway. No access log: every request would be a line in the sandbox's log.
    uvicorn.run(create_app(args.cwd), host=args.host, port=args.port, access_log=False,
                timeout_keep_alive=640)


if __name__ == "__main__":
    main()
