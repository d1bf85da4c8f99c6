"""The `llama-tq` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__, paths

DESCRIPTION = """\
llama-tq: TurboQuant KV cache types (tq3, tq4) for llama.cpp.

The patched llama.cpp tools (llama-perplexity, llama-completion, llama-cli, llama-server,
llama-bench) are installed with this package; these subcommands inspect and extend it."""

EPILOG = """\
examples:
  llama-tq validate                     codec MSE vs. TurboQuant's bounds
  llama-tq memory                       KV cache size per type for the default model
  llama-tq memory model.gguf --ctx 32768
  llama-tq patch ~/src/llama.cpp --check   would our series apply to your tree?
  llama-tq patch ~/src/llama.cpp        apply it (atomic; --revert undoes it)
  llama-tq paths                        where the tools and libraries are"""


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validate

    rows = validate(n=args.n, seed=args.seed)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def _cmd_memory(args: argparse.Namespace) -> int:
    from .memory import memory_report
    from .models import ModelError, default_model

    try:
        model = args.model or default_model()
    except ModelError as e:
        print(f"llama-tq: error: {e}", file=sys.stderr)
        return 2
    if not Path(model).is_file():
        print(f"llama-tq: error: no such model file: {model}", file=sys.stderr)
        return 2
    report = memory_report(model, n_ctx=args.ctx)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from . import patcher

    tree = args.dir.resolve()
    try:
        if args.check:
            result = patcher.check(tree)
            print(result.message)
            return 0 if result.state in ("applies", "applied") else 1
        print(patcher.revert(tree) if args.revert else patcher.apply(tree))
    except patcher.PatchError as e:
        print(f"llama-tq: error: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_paths(args: argparse.Namespace) -> int:
    info = {"bin": str(paths.bin_dir()), "lib": str(paths.lib_dir()), "series": str(paths.series_root())}
    for k, v in info.items():
        print(f"{k:<7} {v}")
    print(f"\nUse the patched libraries from llama-cpp-python:  export LLAMA_CPP_LIB_PATH={info['lib']}")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from . import devtree, patcher

    try:
        print(devtree.init(args.dir) if args.action == "init" else devtree.export(args.dir))
    except patcher.PatchError as e:
        print(f"llama-tq: error: {e}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llama-tq", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"llama-tq {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="measure the codec's MSE against TurboQuant's theoretical bounds")
    p.add_argument("-n", type=int, default=10_000, help="random unit vectors (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the table as JSON here")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("memory", help="KV cache bytes per token and total per cache type for a model")
    p.add_argument("model", nargs="?", type=Path, help="a .gguf file (default: Gemma 3 270M from PyPI)")
    p.add_argument("--ctx", type=int, default=4096, help="context length for the totals (default 4096)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.set_defaults(func=_cmd_memory)

    p = sub.add_parser("patch", help="apply llama-tq's patch series to your own llama.cpp tree")
    p.add_argument("dir", type=Path, help="the llama.cpp source tree")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="only say whether it applies (and why not); change nothing")
    g.add_argument("--revert", action="store_true", help="remove the series, restoring the tree exactly")
    p.set_defaults(func=_cmd_patch)

    p = sub.add_parser("paths", help="show where the tools, libraries and patch series are")
    p.set_defaults(func=_cmd_paths)

    p = sub.add_parser("dev", help="developers: edit the patch series in a git working copy of the base")
    p.add_argument("action", choices=["init", "export"], help="init: create the working copy; export: format-patch")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_cmd_dev)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
