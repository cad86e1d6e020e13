"""The ``ssl-engine`` command: the engine's command-line tools behind one name.

    ssl-engine train config=quickstart/simclr_digits [config.A.B=value ...]
    ssl-engine extract config=feature_extraction/extract_resnet_digits config.MODEL...=<ckpt>
    ssl-engine evaluate config=feature_extraction/extract_resnet_digits ...
    ssl-engine report ./checkpoints/quickstart_simclr_digits
    ssl-engine compare RUN_DIR RUN_DIR ... [--out runs.png]
    ssl-engine export RUN_DIR --out model.safetensors [--to timm|torchvision|vissl]

Each subcommand takes the arguments of its script in tools/ (``SUBCOMMANDS`` names it) and
runs that script's ``main``; the scripts stay, for those who run them with ``python``.
``train`` and ``extract`` run the launcher (``engines/launcher.py``) as
tools/run_distributed_engines.py does; ``extract`` adds ``engine_name=extract_features``
unless the command line names an engine.

This module imports nothing heavy at its top, and names what a subcommand runs as strings
imported only when it runs: ``ssl-engine --help`` answers at once, and ``train`` forks its
out-of-memory watcher (``utils/oom.py``) before torch is imported, which the watcher needs
(a copy of a process that has loaded torch would hold its memory too).
"""
import difflib
import importlib
import importlib.util
import logging
import os
import sys
from typing import Dict, NamedTuple, Optional, Sequence

from ssl_engine.utils.install_paths import data_folder, installed_folder
from ssl_engine.utils.oom import watch_parent

PROG = "ssl-engine"
LAUNCHER = "ssl_engine.engines.launcher"  # its main(argv) runs an engine on a config
HYDRA_USAGE = "config=<group>/<name>|<file.yaml> [engine_name=...] [config.A.B=value ...]"


class Subcommand(NamedTuple):
    summary: str  # its line in ``ssl-engine --help``
    script: str  # tools/<script>: it takes the same arguments
    engine: Optional[str] = None  # run by the launcher, with this default engine_name


SUBCOMMANDS: Dict[str, Subcommand] = {
    "train": Subcommand("pretrain or fine-tune a model on a config: checkpoints, logs, report",
                        "run_distributed_engines.py", "train"),
    "extract": Subcommand("dump a model's features per split and layer as .npy "
                          "(engine_name=extract_features)", "run_distributed_engines.py",
                          "extract_features"),
    "evaluate": Subcommand("weighted k-NN top-1/top-5 of TEST features against TRAIN's, "
                           "extracting them first when missing", "nearest_neighbor_test.py"),
    "report": Subcommand("draw report.png and report.html of a run folder", "report.py"),
    "compare": Subcommand("put run folders side by side: a table and their curves",
                          "compare_runs.py"),
    "export": Subcommand("export a run's model for timm, torchvision, safetensors or VISSL",
                         "export_model.py"),
}


def usage() -> str:
    """``ssl-engine --help``: the subcommands, one line each."""
    width = max(map(len, SUBCOMMANDS))
    lines = [f"usage: {PROG} <subcommand> [arguments ...]", "",
             "A self-supervised learning engine for images. Subcommands (each takes the "
             "arguments of its script in tools/; '<subcommand> --help' says more):", ""]
    lines += [f"  {name:<{width}}  {sub.summary} [tools/{sub.script}]"
              for name, sub in SUBCOMMANDS.items()]
    return "\n".join(lines)


def subcommand_usage(name: str) -> str:
    sub = SUBCOMMANDS[name]
    return (f"usage: {PROG} {name} {HYDRA_USAGE}\n\n{sub.summary}.\nThe same arguments as "
            f"'python tools/{sub.script}'; see docs/config.md for the config= forms.\n")


def unknown_subcommand(name: str) -> str:
    close = difflib.get_close_matches(name, SUBCOMMANDS, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (f"error: unknown subcommand '{name}': {hint}the subcommands are "
            f"{', '.join(SUBCOMMANDS)} ('{PROG} --help')")


def run_engine(argv: Sequence[str], engine: Optional[str] = None) -> int:
    """The launcher on ``argv`` (with ``engine_name=<engine>`` first unless ``argv`` names
    one), with the out-of-memory watcher forked before torch is imported. A run that failed
    (status 1) has said all it has to say in one line: the process then leaves without the
    interpreter's teardown, where torch's finalisers of shared memory left by dead
    data-loader workers can print "Exception ignored ..." tracebacks after that line."""
    argv = list(argv)
    if engine and not any(arg.startswith("engine_name=") for arg in argv):
        argv.insert(0, f"engine_name={engine}")
    watch = watch_parent()
    code = importlib.import_module(LAUNCHER).main(argv)
    watch.finished()
    if code == 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run_script(name: str, argv: Sequence[str]) -> int:
    """``main(argv)`` of the subcommand's script in tools/ (beside the package, or installed
    under <prefix>/share/ssl_engine/tools); a missing script is one line and status 2."""
    script = SUBCOMMANDS[name].script
    folder = data_folder("tools")
    path = folder / script if folder else installed_folder("tools") / script
    if not path.is_file():
        print(f"error: {PROG} {name} runs tools/{script}, which is not there ({path}): this "
              "checkout or install does not have it yet", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location(f"ssl_engine_tool_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        print(f"error: {path} has no main(argv) for {PROG} {name} to run", file=sys.stderr)
        return 2
    sys.argv[0] = f"{PROG} {name}"  # the program name argparse puts in its usage and errors
    return int(module.main(list(argv)) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``ssl-engine <subcommand> [arguments ...]``: the exit status of the subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(unknown_subcommand(name), file=sys.stderr)
        return 2
    sub = SUBCOMMANDS[name]
    if rest and rest[0] in ("-h", "--help") and (sub.engine or name == "evaluate"):
        print(subcommand_usage(name))  # the others are argparse scripts with their own help
        return 0
    if sub.engine:
        return run_engine(rest, sub.engine)
    return run_script(name, rest)


if __name__ == "__main__":
    sys.exit(main())
