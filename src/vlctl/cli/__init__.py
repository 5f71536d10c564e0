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
import re
import sys

from vlctl.fsops import VlctlError

# (words, "module:function", help)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("data mad", "data:data_mad", "generate the MAD dataset (MNIST digits with attributes; TEVI)"),
    ("data shapes", "data:data_shapes", "generate the Clevr-4-like shapes set (color, texture, count, shape; ControlEmbed)"),
    ("data scenes", "data:data_scenes", "generate compositional scenes (objects, attributes, relations; 3VL)"),
    ("train clip", "train:train_clip", "train a TinyCLIP from scratch on a captioned dataset"),
    ("embed", "store:embed", "embed images (and their captions) from a folder, a CSV/JSONL or a generated set into a store"),
    ("index", "store:index", "embed images into a store with a FAISS index (new images only), or fill a Milvus collection from a store (--backend)"),
    ("search", "store:search", "search a store (or a Milvus collection: --backend) by text, image or embedding"),
    ("store convert", "store:convert", "convert a store of an older vlctl or a clip-retrieval folder into a store"),
    ("verify", "verify:verify", "check every file of a store, generated set or checkpoint against its recorded sha256"),
    ("fit sae", "methods:fit_sae", "fit a TopK SAE (or a CG-SAE with --concepts) on a store's image embeddings"),
    ("fit tevi", "methods:fit_tevi", "train TEVI's caption-conditioned mask over a fitted SAE"),
    ("fit controlembed", "methods:fit_controlembed", "fit the ControlEmbed hypernetwork on a store's labelled embeddings"),
    ("fit tree", "methods:fit_tree", "LoRA fine-tuning of a TinyCLIP with the 3VL tree loss (or contrastive / negclip)"),
    ("score tevi", "methods:score_tevi", "TEVI scores of every stored image against every stored caption"),
    ("inspect sae", "inspect:inspect_sae", "name every latent of a fitted SAE with text, show its top images, check the names"),
    ("cluster", "methods:cluster", "cluster a store by one attribute (ControlEmbed) and draw a contact sheet per cluster"),
    ("explain", "explain:explain", "HilaCAM / Anchor / DiRe relevancy overlays of one image and its text(s) (3VL)"),
    ("tree", "explain:tree", "print the 3VL caption tree (levels and one-word hard negatives) of a caption"),
    ("audit", "audit:audit", "3VL compositional audit of an encoder on your image-caption pairs (trees, accuracy by POS)"),
    ("eval retrieval", "evaluate:eval_retrieval", "zero-shot image-text retrieval recall@k both ways (CLIP_benchmark)"),
    ("reproduce", "evaluate:reproduce", "run a paper reproduction recipe stage by stage, with caching"),
    ("serve", "serve:serve", "a local web page to search, steer, cluster and explain a store (or the demo's: --demo)"),
)

GROUPS = {
    "data": "generate synthetic datasets",
    "train": "train models (works under torchrun)",
    "fit": "fit a method on stored embeddings",
    "score": "score stored embeddings with a fitted method",
    "eval": "evaluate an encoder on a benchmark",
    "inspect": "see what a fitted model learned",
    "store": "manage stores",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line on stderr (exit 2), like every other vlctl error:
    'vlctl: error: --lr must be > 0, got -1 (see vlctl train clip --help)'."""

    def error(self, message: str):
        m = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message, re.DOTALL)
        if m:  # "argument --lr: must be > 0" -> "--lr must be > 0"; other messages keep the flag's colon
            name, rest = m.groups()
            message = f"{name} {rest}" if rest.startswith("must ") else f"{name}: {rest}"
        self.exit(2, f"vlctl: error: {_single_line(message)} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, except that arguments no parser knows are refused by the command's own
        parser, so the message points at its help (`vlctl search --help`), not at `vlctl --help`."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(parsed, "_vlctl_parser", None) or self
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def command_words(argv: list[str]) -> tuple[str, ...] | None:
    """The words of the command `argv` names ("fit", "sae"), read before any parser is built: the
    first one or two arguments that are not top-level flags; None when they name no command."""
    words = [a for a in argv[:3] if not a.startswith("-")][:2]
    for n in (2, 1):
        if " ".join(words[:n]) in {w for w, _, _ in COMMANDS}:
            return tuple(words[:n])
    return None


def build_parser(only: tuple[str, ...] | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The whole command line. With every=False, only the command `only` gets its flags; the others
    are named with their help, for `vlctl --help` and a misspelt command's choices. Adding a
    command's flags imports the modules its configs live in (torch for most), so `vlctl tree --help`
    builds one command's flags, not all of them."""
    from vlctl import __version__

    parser = _Parser(prog="vlctl", description="Controllable vision-language embedding spaces.")
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
        p = sub.add_parser(name, help=help_, description=help_)
        if not every and tuple(words.split()) != only:
            continue
        module, func = target.split(":")
        mod = importlib.import_module(f"vlctl.cli.{module}")
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        getattr(mod, func + "_args")(p)
        flags = {a.dest: (a.option_strings or [a.metavar or a.dest])[0] for a in p._actions}
        p.set_defaults(handler=getattr(mod, func), _vlctl_flags=flags, _vlctl_parser=p)
    return parser


MAX_ECHO = 200  # characters of one user value an error repeats
MAX_LINE = 2000  # characters of an error line
_LONG_QUOTED = re.compile("'[^'\n]{%d,}'|\"[^\"\n]{%d,}\"" % ((MAX_ECHO + 1,) * 2))  # noqa: UP031


def _single_line(text: str) -> str:
    """`text` as one line: newlines folded, quoted values over MAX_ECHO characters cut (a 10,000-word
    caption is not repeated whole), the line cut at MAX_LINE."""
    from vlctl.config import shorten

    def cut(m: re.Match) -> str:
        s = m.group(0)
        return f"{s[:MAX_ECHO]}...{s[0]} ({len(s) - 2} characters)"

    text = _LONG_QUOTED.sub(cut, text)
    text = " / ".join(ln.strip() for ln in text.strip().splitlines() if ln.strip())
    return shorten(text, MAX_LINE)


def _one_line(e: BaseException) -> str:
    """An error as the one line the user sees: OSError names its file and reason."""
    if isinstance(e, OSError) and e.filename is not None:
        text = f"{e.filename}: {e.strerror or e}"
    elif isinstance(e, UnicodeDecodeError):
        text = f"not UTF-8 text (byte {e.start}: {e.reason}); vlctl reads text files as UTF-8"
    else:
        text = str(e).strip() or type(e).__name__
        if not isinstance(e, VlctlError):
            text = text.splitlines()[0]
    return _single_line(text)


def _argv_not_utf8(argv: list[str]) -> str | None:
    """The error for the first argument holding bytes that are not UTF-8 (Python passes them on as
    lone surrogates), naming the flag it belongs to; None when every argument is UTF-8."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = arg.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate that stands for no byte
                raw = arg.encode("utf-8", "surrogatepass")
            try:
                raw.decode("utf-8")
                at = 0
            except UnicodeDecodeError as e:
                at = e.start
            prev = argv[i - 1] if i else ""
            name = prev if prev.startswith("--") and "=" not in prev else f"argument {i + 1}"
            if arg.startswith("--"):
                name = arg.partition("=")[0].encode("utf-8", "backslashreplace").decode()
            return (f"{name}: not UTF-8 at byte {at} (0x{raw[at]:02x}) of "
                    f"{_show_bytes(raw)}; vlctl reads its arguments as UTF-8")
    return None


def _show_bytes(raw: bytes) -> str:
    from vlctl.config import shorten

    return shorten(repr(raw), MAX_ECHO)


def main(argv: list[str] | None = None) -> int:
    """The CLI's one error boundary: a user's mistake (VlctlError, and the OSError, UnicodeDecodeError
    and ValueError that bad input raises) is one line on stderr and exit code 2; Ctrl-C is one line
    and 130. `--debug` or VLCTL_DEBUG=1 lets the exception through, with its traceback.

    Bad values fail before any work: an argument that is not UTF-8, then a flag out of its range
    (while parsing: `vlctl.config.flag_type`, `vlctl.cli.args`), then the file system under the path
    flags (`check_paths`) and the configs the flags make (`check_config_args`). A user's value is
    echoed at most MAX_ECHO characters long."""
    from vlctl.cli.args import check_paths
    from vlctl.config import check_config_args

    argv = sys.argv[1:] if argv is None else list(argv)
    bad = _argv_not_utf8(argv)
    if bad:
        print(f"vlctl: error: {bad}", file=sys.stderr)
        return 2
    parser = build_parser(command_words(argv), every=False)  # one command's flags: --help in a fraction of the time
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (one line, already printed), or --help / --version
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    debug = args.debug or os.environ.get("VLCTL_DEBUG", "") not in ("", "0")
    from vlctl.cli.interrupt import interrupted_message, out_state

    before: tuple = (None, None)
    if not debug:
        import warnings

        warnings.showwarning = _one_line_warning
    try:
        check_paths(args)  # the path flags against the file system, then every config the flags make:
        check_config_args(args)  # both before the command starts any work
        before = out_state(args)
        result = args.handler(args)
    except BrokenPipeError:  # the reader of our stdout went away (`| head`): it has what it wanted
        return _stdout_gone()
    except KeyboardInterrupt:
        if debug:
            raise
        print(interrupted_message(args, before), file=sys.stderr)
        return 130
    except (VlctlError, OSError, UnicodeDecodeError, ValueError) as e:
        if debug:
            raise
        print(f"vlctl: error: {_one_line(e)}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    from vlctl.cli.listing import plain, print_listed, without_lists

    try:
        if getattr(args, "json", False):
            print(json.dumps(result, indent=2))
        elif result:
            for k, v in without_lists(result).items():
                print(f"{k}: {plain(v)}")
            sys.stdout.flush()
            print_listed(result)
        sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()
    return 0


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning of vlctl's own as the user sees every other message: one line, no source line
    (`UntrainedAttributeWarning` printed its file, line number and the `warnings.warn` call). Other
    packages' warnings keep Python's form, which names where they come from."""
    import warnings

    if f"{os.sep}vlctl{os.sep}" not in str(filename):
        warnings._showwarnmsg_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
        return
    print(f"vlctl: warning: {_single_line(str(message))}", file=sys.stderr if file is None else file)


def _stdout_gone() -> int:
    """After a write to a closed pipe (`vlctl search ... --json | head -c 10`): no traceback, and
    none at exit either, when Python flushes stdout again (it now writes to /dev/null). Exit 0: the
    command did its work, and the reader stopped reading by choice."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
