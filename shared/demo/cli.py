"""``ignis demo-model DIR``: write the built-in demo checkpoint into a directory."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ignis.shared.demo.builder import FILES, write_demo_model
from ignis.shared.demo.tokenizer import DemoModelUnavailable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="directory to write the checkpoint into (created if missing)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite the checkpoint files if the directory already holds any of them")


def run(args: argparse.Namespace) -> int:
    target: Path = args.dir
    if target.exists() and not target.is_dir():
        print(f"ignis demo-model: {target} exists and is not a directory", file=sys.stderr)
        return 1
    present = [name for name in FILES if (target / name).exists()]
    if present and not args.force:
        print(f"ignis demo-model: {target} already holds {', '.join(present)}; pass --force to overwrite",
              file=sys.stderr)
        return 1
    try:
        out = write_demo_model(target)
    except (OSError, DemoModelUnavailable) as e:
        print(f"ignis demo-model: cannot write the demo model to {target}: {e}", file=sys.stderr)
        return 1
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    print(f"wrote the demo model ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
          f"vocab {config['vocab_size']}) to {out}")
    return 0
