"""The `mili` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway.serve import add_arguments as add_serve_arguments
from gateway.server.request_id import RequestIdLogFilter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mili", description="MILI: an OpenAI-compatible server for Qwen-family models")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    add_serve_arguments(serve)
    convert = sub.add_parser("convert-gguf", help="convert a llama/qwen2/qwen3 GGUF file into an HF-format directory")
    convert.add_argument("gguf_file")
    convert.add_argument("out_dir")
    args = parser.parse_args(argv)
    # A line written while a request is served names its X-Request-Id (gateway/server/request_id.py).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s:%(request_id)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdLogFilter())
    if args.command == "serve":
        from gateway.serve import run

        try:
            return run(args)
        except ValueError as e:  # a bad flag value or model path: one line, not a traceback
            print(f"mili serve: {e}", file=sys.stderr)
            return 2
    if args.command == "convert-gguf":
        from shared.gguf_import.convert import convert_gguf

        try:
            out = convert_gguf(args.gguf_file, args.out_dir)
        # The importer's errors (bad file, unsupported architecture, quant type or tokenizer) are all
        # ValueErrors that name the problem; the user needs that line, not a traceback.
        except (ValueError, OSError) as e:
            print(f"mili convert-gguf: {e}", file=sys.stderr)
            return 2
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
