"""The `llama-tq` command."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from . import __version__, paths
from .errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, LlamaTqError, ModelError, UsageError

DESCRIPTION = """\
llama-tq: TurboQuant KV cache types (tq3, tq4) for llama.cpp.

The patched llama.cpp tools (llama-perplexity, llama-completion, llama-cli, llama-server,
llama-bench, llama-tokenize) are installed with this package; these subcommands measure and extend it."""

EPILOG = """\
examples:
  llama-tq demo                         the main job: f16/q8_0/q4_0/tq4/tq3 side by side (minutes on 2 cores)
  llama-tq ppl --text wiki.test.raw     PPL + KLD vs f16 for a matrix of caches (table, JSON, CSV, PNG)
  llama-tq niah --ctx 4096              strict needle in a haystack, start/middle/end
  llama-tq bench                        llama-bench ratios vs q4_0 at depths 0 and 4096
  llama-tq validate                     codec MSE vs. TurboQuant's bounds
  llama-tq calibrate -o m.tqcal         what tq3a keys need: then -ctk tq3a --tq-keys-cal m.tqcal
  llama-tq memory                       KV cache size per type for the default model
  llama-tq memory model.gguf --ctx 32768
  llama-tq patch ~/src/llama.cpp --check   would our series apply to your tree?
  llama-tq patch ~/src/llama.cpp        apply it (atomic; --revert undoes it)
  llama-tq v3 --text wiki.test.raw      TriAttention V3 validation matrix (PPL/KLD + NIAH, with and without eviction)
  llama-tq evict --text wiki.test.raw   eviction policies side by side at 25/50/75 % budgets (KLD, PPL, rounds)
  llama-tq paths                        where the tools and libraries are

exit status: 0 success; 1 a run broke or was INVALID, a target was missed, or the patch series does not apply;
2 bad input (arguments, configs, the protocol, missing files or model); 3 the environment (tools, base, pip)."""


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validate

    rows = validate(n=args.n, seed=args.seed)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return EXIT_OK if all(r["ok"] for r in rows) else EXIT_FAILED


def _cmd_memory(args: argparse.Namespace) -> int:
    from .memory import memory_report

    model = _model(args)
    report = memory_report(model, n_ctx=args.ctx, triatt_budget=args.triatt_budget, n_seq=args.np)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _cmd_patch(args: argparse.Namespace) -> int:
    from .tooling import patcher

    tree = args.dir.resolve()
    if args.check:
        result = patcher.check(tree)
        print(result.message)
        return EXIT_OK if result.state in ("applies", "applied") else EXIT_FAILED
    print(patcher.revert(tree) if args.revert else patcher.apply(tree))
    return EXIT_OK


def _int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is outside {lo}..{hi if hi is not None else 'any'}")
        return v

    return parse


def _int_list(lo: int, hi: int | None = None) -> Callable[[str], str]:
    """An argparse type: comma-separated integers in [lo, hi] (kept as the string the harness takes)."""
    one = _int_at_least(lo, hi)

    def parse(text: str) -> str:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} holds no number")
        for x in items:
            one(x)
        return ",".join(items)

    return parse


def _tool_args(text: str) -> str:
    """An argparse type: more tool arguments, as a shell would split them."""
    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot split {text!r} into arguments: {e}") from None
    return text


def _model(args: argparse.Namespace) -> Path:
    from .models import default_model

    model = Path(args.model) if args.model else default_model()
    if not model.is_file():
        raise ModelError(f"no such model file: {model}")
    return model


def _cmd_ppl(args: argparse.Namespace) -> int:
    from .harness import ppl
    from .harness.common import KvConfig

    configs = KvConfig.parse_list(args.kv)
    model = _model(args)
    results = ppl.run_matrix(model, args.text, configs, ctx=args.ctx, chunks=args.chunks, threads=args.threads,
                             allow_noisy=args.allow_noisy, out_dir=args.out, extra_args=shlex.split(args.extra),
                             evict_args=shlex.split(args.evict))  # fmt: skip
    ppl.print_table(results, ref=args.ref)
    meta = {"model": str(model), "text": str(args.text), "ctx": args.ctx, "chunks": args.chunks,
            "threads": args.threads, "extra": args.extra, "evict": args.evict, "noisy": args.chunks < 3,
            "title": f"{model.name}, -c {args.ctx} --chunks {args.chunks}"
            + (" (NOISY: < 3 chunks)" if args.chunks < 3 else "")}  # fmt: skip
    ppl.write_outputs(results, args.out, meta)
    print(f"\nwrote {args.out}/ppl.json, ppl.csv, kld_vs_bits.png (logs in {args.out}/logs)")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def _haystack(args: argparse.Namespace) -> str:
    from .harness.demo import default_text

    if args.text is None:
        return default_text()
    if not args.text.is_file():
        raise UsageError(f"no such text file: {args.text}")
    return args.text.read_text(errors="replace")


def _cmd_niah(args: argparse.Namespace) -> int:
    from .harness import niah
    from .harness.common import KvConfig

    configs = KvConfig.parse_list(args.kv)
    positions = niah.parse_positions(args.positions)
    needle = niah.Needle.parse(args.needle, args.answer)
    model = _model(args)
    results = niah.run_grid(model, _haystack(args), configs, args.ctx, positions, needle, style=args.style,
                            n_predict=args.n_predict, think=args.think, threads=args.threads,
                            extra_args=shlex.split(args.extra), out_dir=args.out)  # fmt: skip
    niah.print_table(results)
    meta = {"model": str(model), "text": str(args.text or "pydoc_data.topics"), "ctx": args.ctx, "style": args.style,
            "needle": needle.sentence, "answer": needle.answer, "n_predict": args.n_predict, "extra": args.extra,
            "title": f"{model.name}, {args.ctx} tokens, {args.style}"}  # fmt: skip
    niah.write_outputs(results, args.out, meta)
    print(f"\nwrote {args.out}/niah.json, niah.png (logs in {args.out}/logs)")
    if args.require_pass and any(r.status != "PASS" for r in results):
        return EXIT_FAILED
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def _cmd_demo(args: argparse.Namespace) -> int:
    from .harness import demo
    from .harness.common import KvConfig

    KvConfig.parse_list(args.kv)  # refuse a bad --kv before anything runs
    if args.text is not None and not args.text.is_file():
        raise UsageError(f"no such text file: {args.text}")
    report = demo.run(_model(args), args.text, args.ctx, args.chunks, args.out, threads=args.threads, kv=args.kv)
    print()
    demo.print_table(report)
    print(f"wrote {args.out}/demo.json, demo.png (PPL runs in {args.out}/ppl, NIAH runs in {args.out}/niah)")
    return EXIT_OK if all(r["ppl_ok"] for r in report["rows"]) else EXIT_FAILED


def _cmd_bench(args: argparse.Namespace) -> int:
    from .harness import bench
    from .harness.common import KvConfig

    configs = KvConfig.parse_list(args.kv)
    if args.ref not in [c.name for c in configs]:
        raise UsageError(f"the reference {args.ref} is not among --kv")
    if args.prompt == 0 and args.gen == 0:
        raise UsageError("--prompt and --gen are both 0: nothing to measure")
    model = _model(args)
    rows = bench.run(model, configs, depths=args.depths, prompt=args.prompt, gen=args.gen, reps=args.reps,
                     rounds=args.rounds, threads=args.threads, extra=shlex.split(args.extra),
                     out_dir=args.out)  # fmt: skip
    out = bench.table(rows, args.ref)
    meta = {"model": str(model), "depths": args.depths, "prompt": args.prompt, "gen": args.gen, "reps": args.reps,
            "rounds": args.rounds, "threads": args.threads, "ref": args.ref, "extra": args.extra}  # fmt: skip
    bench.write_outputs(out, rows, args.out, meta)
    print(f"wrote {args.out}/bench.json, bench.csv")
    return EXIT_OK


def _cmd_evict(args: argparse.Namespace) -> int:
    from .harness import evict
    from .harness.common import KvConfig

    budgets = tuple(int(x) for x in args.budgets.split(","))  # checked by its argparse type: 1..99
    unknown = [p for p in args.policies.split(",") if p not in evict.POLICIES]
    if unknown:
        raise UsageError(f"unknown --policies {', '.join(unknown)} (known: {', '.join(evict.POLICIES)})")
    if not args.text.is_file():
        raise UsageError(f"no such text file: {args.text}")
    policies = {p: evict.POLICIES[p] for p in args.policies.split(",")}
    report = evict.run(_model(args), args.text, args.out, caches=KvConfig.parse_list(args.caches), ctx=args.ctx,
                       chunks=args.chunks, budgets=budgets, policies=policies, threads=args.threads)  # fmt: skip
    print(f"\nwrote {args.out}/evict.json, evict.md, evict_kld_vs_budget.png (logs in {args.out}/logs)")
    return EXIT_OK if all(r["ok"] for r in report["rows"]) else EXIT_FAILED


def _cmd_v3(args: argparse.Namespace) -> int:
    from .harness import v3
    from .harness.common import KvConfig

    caches = KvConfig.parse_list(args.caches)
    retentions = tuple(int(x) for x in args.retention.split(",") if x.strip())
    if not args.text.is_file():
        raise UsageError(f"no such text file: {args.text}")
    haystack = _haystack(argparse.Namespace(text=args.haystack or args.text))
    report = v3.run(_model(args), args.text, haystack, caches, args.out, ctx=args.ctx, niah_ctx=args.niah_ctx,
                    retentions=retentions, niah_retention=args.niah_retention, threads=args.threads,
                    flags=shlex.split(args.flags))  # fmt: skip
    print(f"\nwrote {args.out}/v3.json, v3.md (runs in {args.out}/ppl_*, {args.out}/niah_*)")
    return EXIT_OK if report["ok"] else EXIT_FAILED


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import calibrate

    model = _model(args)
    x = calibrate(model, _haystack(args), args.tokens, args.out, threads=args.threads)
    print(f"wrote {args.out}: the key energies of {len(x)} layers over {args.tokens} tokens; use it with "
          f"-ctk tq3a --tq-keys-cal {shlex.quote(str(args.out))}")  # fmt: skip
    return EXIT_OK


def _cmd_python_binding(args: argparse.Namespace) -> int:
    from .tooling.binding_install import install_llama_cpp_python

    print(install_llama_cpp_python())
    return EXIT_OK


def _cmd_paths(args: argparse.Namespace) -> int:
    info = {"bin": str(paths.bin_dir()), "lib": str(paths.lib_dir()), "series": str(paths.series_root())}
    for k, v in info.items():
        print(f"{k:<7} {v}")
    print(f"\nUse the patched libraries from llama-cpp-python:  export LLAMA_CPP_LIB_PATH={info['lib']}")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from .tooling import devtree

    print(devtree.init(args.dir) if args.action == "init" else devtree.export(args.dir))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llama-tq", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"llama-tq {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="measure the codec's MSE against TurboQuant's theoretical bounds")
    p.add_argument("-n", type=_int_at_least(1), default=10_000, help="random unit vectors (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the table as JSON here")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("memory", help="KV cache bytes per token and total per cache type for a model")
    p.add_argument("model", nargs="?", type=Path, help="a .gguf file (default: Gemma 3 270M from PyPI)")
    p.add_argument("--ctx", type=_int_at_least(1), default=4096, help="context length for the totals (default 4096)")
    p.add_argument("--triatt-budget", type=_int_at_least(0), default=0,
                   help="also TriAttention's host memory at this eviction budget (default 0: off)")  # fmt: skip
    p.add_argument("--np", type=_int_at_least(1), default=1, help="sequences (llama-server --parallel), default 1")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.set_defaults(func=_cmd_memory)

    p = sub.add_parser("patch", help="apply llama-tq's patch series to your own llama.cpp tree")
    p.add_argument("dir", type=Path, help="the llama.cpp source tree")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="only say whether it applies (and why not); change nothing")
    g.add_argument("--revert", action="store_true", help="remove the series, restoring the tree exactly")
    p.set_defaults(func=_cmd_patch)

    p = sub.add_parser("ppl", help="perplexity + KLD vs f16 over a matrix of KV cache configurations")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, required=True, help="evaluation text, e.g. wikitext-2 wiki.test.raw")
    p.add_argument(
        "--kv",
        default="q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3,q8_0/tq3",
        help="K/V configs, comma-separated; '@rot' turns upstream's rotation on for TQ sides",
    )
    p.add_argument("--ctx", type=_int_at_least(64), default=2048)
    p.add_argument("--chunks", type=_int_at_least(1), default=16)
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("--ref", default="q4_0/q4_0", help="config the KLD ratios are relative to")
    p.add_argument("--allow-noisy", action="store_true", help="allow fewer than 3 chunks (results are labelled)")
    p.add_argument("--out", type=Path, default=Path("out/ppl"), help="output directory (default out/ppl)")
    p.add_argument(
        "--extra", type=_tool_args, default="", help="more llama-perplexity arguments, with '=': --extra='-ngl 99'"
    )
    p.add_argument(
        "--evict", type=_tool_args, default="", help="eviction settings for every config (not the f16 base), with '=': "
        "--evict='--triatt-budget 1800 --triatt-policy v3'; a run whose log shows no eviction round is marked invalid",
    )  # fmt: skip
    p.set_defaults(func=_cmd_ppl)

    p = sub.add_parser("niah", help="strict needle-in-a-haystack through llama-completion (PASS/PARTIAL/FAIL)")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, help="haystack text (default: Python's pydoc_data topics)")
    p.add_argument("--kv", default="f16/f16,q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3,q8_0/tq3")
    p.add_argument("--ctx", type=_int_at_least(64), default=4096, help="context in tokens (model's tokenizer)")
    p.add_argument("--positions", default="start,middle,end", help="names (start/middle/end) and/or fractions")
    p.add_argument("--style", choices=["cloze", "question"], default="cloze",
                   help="cloze (base models, the default model) or an instruction question")  # fmt: skip
    p.add_argument("--needle", default="The secret code word is PURPLE ELEPHANT 7742.", help="the sentence to hide")
    p.add_argument("--answer", help="the exact string to find (default: what follows the needle's last ' is ')")
    p.add_argument("-n", "--n-predict", type=_int_at_least(1), default=16, help="tokens to generate (default 16)")
    p.add_argument("--think", action="store_true", help="a thinking model: allow 2048 tokens, judge after </think>")
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("--extra", type=_tool_args, default="", help="more llama-completion arguments: --extra='-ngl 99'")
    p.add_argument("--require-pass", action="store_true", help="exit 1 unless every run PASSes")
    p.add_argument("--out", type=Path, default=Path("out/niah"))
    p.set_defaults(func=_cmd_niah)

    p = sub.add_parser("demo", help="the main job: KV bytes, KLD, PPL and NIAH of each cache type side by side")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, help="evaluation text (default: Python's pydoc_data topics, PSF License)")
    p.add_argument(
        "--ctx", type=_int_at_least(64), default=1024, help="context for PPL chunks and the NIAH prompt (default 1024)"
    )
    p.add_argument("--chunks", type=_int_at_least(1), default=3, help="PPL chunks (default 3, the protocol's minimum)")
    p.add_argument("--kv", default="f16/f16,q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3,q8_0/tq3")
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="output directory (default out/demo)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("bench", help="llama-bench speed of KV cache configurations, as ratios to a reference")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--kv", default="f16/f16,q8_0/q8_0,q4_0/q4_0,tq4/tq4,tq3/tq3")
    p.add_argument("--ref", default="q4_0/q4_0", help="config the ratios are relative to (default q4_0/q4_0)")
    p.add_argument("--depths", "-d", type=_int_list(0), default="0,4096")
    p.add_argument("--prompt", "-p", type=_int_at_least(0), default=512)
    p.add_argument("--gen", "-n", type=_int_at_least(0), default=64)
    p.add_argument("--reps", "-r", type=_int_at_least(1), default=3, help="llama-bench repetitions per round")
    p.add_argument("--rounds", type=_int_at_least(1), default=1, help="interleaved rounds over all configs")
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument(
        "--extra", type=_tool_args, default="", help="more llama-bench arguments, with '=': --extra='--tq-keys-cal F'"
    )
    p.add_argument("--out", type=Path, default=Path("out/bench"))
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("v3", help="TriAttention V3 validation: PPL/KLD at retentions and NIAH, V1/V3 vs none")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, required=True, help="evaluation text (and haystack), e.g. wiki.test.raw")
    p.add_argument("--haystack", type=Path, help="NIAH haystack text (default: --text)")
    p.add_argument("--caches", default="f16/f16,q8_0/tq3,tq3/tq3", help="K/V configs for the PPL matrix")
    p.add_argument("--ctx", type=_int_at_least(64), default=8192, help="PPL context (default 8192)")
    p.add_argument("--niah-ctx", type=_int_at_least(64), default=16384, help="NIAH context in tokens (default 16384)")
    p.add_argument(
        "--retention", type=_int_list(1, 99), default="90,75", help="V3 budgets as %% of --ctx (default 90,75)"
    )
    p.add_argument(
        "--niah-retention", type=_int_at_least(1, 99), default=90, help="V1/V3 budget as %% of --niah-ctx (default 90)"
    )
    p.add_argument(
        "--flags", type=_tool_args, default="", help="more --triatt-* flags, with '=': --flags='--triatt-window 256'"
    )
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("--out", type=Path, default=Path("out/v3"))
    p.set_defaults(func=_cmd_v3)

    p = sub.add_parser("evict", help="eviction policies (V3, V2, V1, StreamingLLM, random) at budgets of the context")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, required=True, help="evaluation text, e.g. wiki.test.raw")
    p.add_argument("--caches", default="f16/f16", help="K/V configs (default f16/f16)")
    p.add_argument("--ctx", type=_int_at_least(64), default=2048, help="PPL context (default 2048)")
    p.add_argument("--chunks", type=_int_at_least(1), default=3, help="chunks (default 3, the protocol's minimum)")
    p.add_argument(
        "--budgets", type=_int_list(1, 99), default="25,50,75", help="budgets as %% of --ctx (default 25,50,75)"
    )
    p.add_argument("--policies", default="V3,V3-nopool,V2,V1,StreamingLLM,random")
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("--out", type=Path, default=Path("out/evict"))
    p.set_defaults(func=_cmd_evict)

    p = sub.add_parser("calibrate", help="the calibration tq3a keys need (-ctk tq3a --tq-keys-cal FILE)")
    p.add_argument("--model", type=Path, help="a .gguf (default: Gemma 3 270M from PyPI)")
    p.add_argument("--text", type=Path, help="calibration text (default: the demo's embedded text)")
    p.add_argument("--tokens", type=_int_at_least(64), default=2048, help="tokens of it to run (default 2048)")
    p.add_argument("--threads", "-t", type=_int_at_least(1), default=2)
    p.add_argument("-o", "--out", type=Path, required=True, help="the calibration file to write")
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("python-binding", help="install the matching llama-cpp-python, bound to these libraries")
    p.set_defaults(func=_cmd_python_binding)

    p = sub.add_parser("paths", help="show where the tools, libraries and patch series are")
    p.set_defaults(func=_cmd_paths)

    p = sub.add_parser("dev", help="developers: edit the patch series in a git working copy of the base")
    p.add_argument("action", choices=["init", "export"], help="init: create the working copy; export: format-patch")
    p.add_argument("dir", type=Path)
    p.set_defaults(func=_cmd_dev)
    return ap


def main(argv: list[str] | None = None) -> int:
    """The one error handler: every LlamaTqError becomes its documented exit code and a one-line message."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LlamaTqError as e:
        print(f"llama-tq: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a path the user named: missing, a directory, unreadable
        print(f"llama-tq: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
