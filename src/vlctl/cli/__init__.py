"""`vlctl` command line: every command is one line of `COMMANDS`.

A line names the command's words, the function that runs it (`module:function` in this package)
and its help. The module also defines `<function>_args(parser)`, which adds the command's flags;
flags that are hyperparameters are generated from the config dataclass that declares them
(`vlctl.config.add_config_args`), so a field is declared once. Handlers import their heavy
modules inside, so `vlctl --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from vlctl.io import VlctlError

# (words, "module:function", help)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("data mad", "data:data_mad", "generate the MAD dataset (MNIST digits with attributes; TEVI)"),
    ("data shapes", "data:data_shapes", "generate the Clevr-4-like shapes set (color, texture, count, shape; ControlEmbed)"),
    ("data scenes", "data:data_scenes", "generate compositional scenes (objects, attributes, relations; 3VL)"),
    ("train clip", "train:train_clip", "train a TinyCLIP from scratch on a captioned dataset"),
    ("embed", "store:embed", "embed images (and their captions) from a folder, a CSV/JSONL or a generated set into a store"),
    ("index", "store:index", "embed a folder of images into a store with a FAISS index (incremental: new images only)"),
    ("search", "store:search", "search a store by text, image or embedding"),
    ("fit sae", "methods:fit_sae", "fit a TopK SAE (or a CG-SAE with --concepts) on a store's image embeddings"),
    ("fit tevi", "methods:fit_tevi", "train TEVI's caption-conditioned mask over a fitted SAE"),
    ("fit controlembed", "methods:fit_controlembed", "fit the ControlEmbed hypernetwork on a store's labelled embeddings"),
    ("fit tree", "methods:fit_tree", "LoRA fine-tuning of a TinyCLIP with the 3VL tree loss (or contrastive / negclip)"),
    ("score tevi", "methods:score_tevi", "TEVI scores of every stored image against every stored caption"),
    ("cluster", "methods:cluster", "cluster a store by one attribute (ControlEmbed) and draw a contact sheet per cluster"),
    ("explain", "explain:explain", "HilaCAM / Anchor / DiRe relevancy overlays of one image and its text(s) (3VL)"),
    ("tree", "explain:tree", "print the 3VL caption tree (levels and one-word hard negatives) of a caption"),
    ("eval retrieval", "evaluate:eval_retrieval", "zero-shot image-text retrieval recall@k both ways (CLIP_benchmark)"),
    ("reproduce", "evaluate:reproduce", "run a paper reproduction recipe stage by stage, with caching"),
)

GROUPS = {
    "data": "generate synthetic datasets",
    "train": "train models (works under torchrun)",
    "fit": "fit a method on stored embeddings",
    "score": "score stored embeddings with a fitted method",
    "eval": "evaluate an encoder on a benchmark",
}


def build_parser() -> argparse.ArgumentParser:
    from vlctl import __version__

    parser = argparse.ArgumentParser(prog="vlctl", description="Controllable vision-language embedding spaces.")
    parser.add_argument("--version", action="version", version=f"vlctl {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (also VLCTL_DEBUG=1)")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, target, help_ in COMMANDS:
        *group, name = words.split()
        sub = top
        if group:
            g = group[0]
            if g not in groups:
                gp = top.add_parser(g, help=GROUPS[g], description=GROUPS[g][0].upper() + GROUPS[g][1:] + ".")
                groups[g] = gp.add_subparsers(dest=g + "_command", required=True, metavar="COMMAND")
            sub = groups[g]
        module, func = target.split(":")
        mod = importlib.import_module(f"vlctl.cli.{module}")
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        getattr(mod, func + "_args")(p)
        p.set_defaults(handler=getattr(mod, func))
    return parser


def _one_line(e: BaseException) -> str:
    """An error as the one line the user sees: OSError names its file and reason."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte {e.start}: {e.reason}); vlctl reads text files as UTF-8"
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0] if not isinstance(e, VlctlError) else text


def main(argv: list[str] | None = None) -> int:
    """The CLI's one error boundary: a user's mistake (VlctlError, and the OSError, UnicodeDecodeError
    and ValueError that bad input raises) is one line on stderr and exit code 2; Ctrl-C is one line
    and 130. `--debug` or VLCTL_DEBUG=1 lets the exception through, with its traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("VLCTL_DEBUG", "") not in ("", "0")
    try:
        result = args.handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("vlctl: interrupted; finished stages and checkpoints are kept (rerun to resume)", file=sys.stderr)
        return 130
    except (VlctlError, OSError, UnicodeDecodeError, ValueError) as e:
        if debug:
            raise
        print(f"vlctl: error: {_one_line(e)}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    elif result:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0
