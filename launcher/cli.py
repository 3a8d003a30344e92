"""The ``ignis`` command: one entry point, one subcommand per job.

Each subcommand lives in the package that owns it and exposes two functions,
``add_arguments(parser)`` and ``run(args) -> int``. They are imported only
when chosen, so ``ignis gateway`` never imports torch and ``ignis --help``
stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from ignis.shared.flags import positionals_first

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("ignis.engine.inspect", "print a model's layers, KV and state sizes and what a pool holds"),
    "demo-model": ("ignis.shared.demo.cli", "write the built-in tiny demo checkpoint into a directory"),
    "engine": ("ignis.engine.cli", "run the engine process (model, KV pool, scheduler) on ZeroMQ"),
    "gateway": ("ignis.gateway.cli", "run the OpenAI-compatible HTTP gateway"),
    "tierd": ("ignis.tierd.cli", "run the tier daemon (KV-RAM arena, KV-disk files)"),
    "serve": ("ignis.launcher.serve", "start tierd, engine and gateway together on one machine"),
}


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is None:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            found[name] = (module, help_text)
    return found


SHORT_USAGE = "%(prog)s [arguments]  (%(prog)s --help lists them)"
"""A bad argument's error comes under this line, not under every flag the command takes."""


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="ignis", description="Inference server for hybrid language models.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in _available().items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False, usage=SHORT_USAGE)
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Import only the chosen subcommand's module where possible.
    if argv and argv[0] in SUBCOMMANDS and argv[0] in _available():
        module_name, help_text = SUBCOMMANDS[argv[0]]
        module = importlib.import_module(module_name)
        # no abbreviations: another server's flag that prefixes one of ours (SGLang's --max-prefill-tokens)
        # is refused naming it, not taken as ours
        parser = argparse.ArgumentParser(prog=f"ignis {argv[0]}", description=help_text, allow_abbrev=False,
                                         usage=SHORT_USAGE)
        module.add_arguments(parser)
        args = parser.parse_args(positionals_first(parser, argv[1:]))
        return int(module.run(args) or 0)
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
