"""A regular (non-editable) install: configs/ and tools/ live beside the package in the
repository, so ``pip install .`` copies them to <prefix>/share/ssl_engine (setup.py's
data_files), where the config composition and ``ssl-engine`` find them. Built here from a
copy of the sources, without network: the wheel is installed without dependencies into a
fresh virtualenv that borrows this environment's (torch, hydra, ...) through a .pth file."""
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(command, cwd, timeout=240):
    proc = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (command, proc.stdout[-1500:], proc.stderr[-1500:])
    return proc.stdout


def test_a_regular_install_finds_the_configs_and_tools(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(REPO / "setup.py", source)
    for folder in ("ssl_engine", "configs", "tools"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", tmp_path / "wheels", source], cwd=tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       cwd=tmp_path).strip())
    (purelib / "borrowed_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheel = next((tmp_path / "wheels").glob("ssl_engine-*.whl"))
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel], cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run([python, "-c", (
        "import ssl_engine.losses, ssl_engine.models\n"
        "from ssl_engine.config import compose_config, config_dir\n"
        "from ssl_engine.utils.install_paths import data_folder\n"
        "_, cfg = compose_config(['config=quickstart/simclr_digits'])\n"
        "print(ssl_engine.__file__, config_dir(), data_folder('tools'), cfg.LOSS.name)")],
        cwd=elsewhere).split()
    share = venv / "share" / "ssl_engine"
    assert where[0].startswith(str(purelib))  # the installed package, not the checkout
    assert where[1:] == [str(share / "configs"), str(share / "tools"), "simclr_info_nce_loss"]
    help_text = run([venv / "bin" / "ssl-engine", "--help"], cwd=elsewhere)
    assert "  compare " in help_text
    proc = subprocess.run([venv / "bin" / "ssl-engine", "compare", elsewhere / "nothing"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=120)
    # the installed tools/compare_runs.py ran and refused the missing folder
    assert proc.returncode == 2 and "nothing" in proc.stderr and "Traceback" not in proc.stderr
