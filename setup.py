"""ssl_engine: a self-supervised learning engine for images."""
from pathlib import Path

from setuptools import find_packages, setup


def repository_folders(*names):
    """data_files for the repository's configs/ and tools/, which live beside the package:
    a regular (non-editable) install copies them to <prefix>/share/ssl_engine/<name>/, where
    ssl_engine/utils/install_paths.py finds them (an editable install reads the checkout's)."""
    files = {}
    for name in names:
        for path in sorted(Path(name).rglob("*")):
            if path.is_file() and path.suffix in (".yaml", ".json", ".py"):
                files.setdefault(f"share/ssl_engine/{path.parent.as_posix()}", []).append(
                    path.as_posix())
    return sorted(files.items())


setup(
    name="ssl_engine",
    version="0.1.0",
    description="Self-supervised pretraining and evaluation of vision models, "
    "configured with Hydra, distributed with torch.distributed",
    python_requires=">=3.9",
    packages=find_packages(include=["ssl_engine", "ssl_engine.*"]),
    # one command, `ssl-engine <subcommand>` (train, extract, evaluate, report, compare,
    # export), instead of a script path that only exists in a checkout
    entry_points={"console_scripts": ["ssl-engine=ssl_engine.cli:main"]},
    data_files=repository_folders("configs", "tools"),
    install_requires=[
        "torch>=2.0",
        "torchvision>=0.15",
        "classy-vision==0.7.0",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "numpy",
        "fairscale>=0.4.13",
        "pillow",
        # TensorBoard event files are written with tensorboard's own SummaryWriter
        "tensorboard",
        # the bundled default data set (handwritten digits) and the stratified splits
        "scikit-learn",
        # the vision_transformer trunk is timm's VisionTransformer (forward_intermediates)
        "timm>=1.0.31,<2",
        # SLURM submission, requeue on preemption (config.SLURM): submitit's executors
        "submitit>=1.5",
        # the run report's pictures (HOOKS.RUN_REPORT, tools/report.py, tools/compare_runs.py),
        # drawn headless on the Agg backend
        "matplotlib",
        # tools/export_model.py's default file format (tensors only: no code runs on loading)
        "safetensors>=0.4",
        # DATA.<split>.DEVICE_AUGMENTATION: batched colour/blur/solarize with per-image factors
        "kornia>=0.9,<0.10",
    ],
    extras_require={
        # lightly: independent implementations of the SSL losses, the tests' oracle;
        # mlflow and wandb: the tests of the experiment trackers, in their local modes;
        # pytest-xdist: the suite on every core (-n N), each worker on its own core
        "dev": ["pytest", "pytest-xdist>=3.5", "lightly==1.6.0", "mlflow>=2.10", "wandb>=0.16"],
        # the experiment trackers, switched on with HOOKS.MLFLOW / HOOKS.WANDB; mlflow (not
        # mlflow-skinny) brings SQLAlchemy for the default local store, mlruns/mlflow.db
        "mlflow": ["mlflow>=2.10"],
        "wandb": ["wandb>=0.16"],
        # the run report's 2-D map by UMAP instead of scikit-learn's t-SNE
        "umap": ["umap-learn"],
    },
)
