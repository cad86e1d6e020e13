"""Losses and trunks derive their own settings (``derive_config``): the config layer names none
of them and imports neither, a loss registered by a user derives its keys with no change to the
config layer, and the shipped quickstart and test configs get every derived setting."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ssl_engine.losses  # noqa: F401  (registers the losses' derivations)
import ssl_engine.models  # noqa: F401  (registers the trunks' derivations and FSDP names)
from ssl_engine.config import ConfigError, compose_config
from ssl_engine.config.derive import crops_per_sample, derive_settings
from ssl_engine.losses import SSLLoss
from ssl_engine.models.registry import MODEL_TRUNKS
from ssl_engine.utils import key_rules
from ssl_engine.utils.classy import LOSS_REGISTRY

REPO = Path(__file__).resolve().parents[1]
CONFIG_PACKAGE = REPO / "ssl_engine" / "config"


def config_sources():
    return sorted(CONFIG_PACKAGE.rglob("*.py"))


def component_names_in(path: Path, names):
    """Every place in ``path``'s text (code, strings, comments) where a name of ``names``
    stands as a word, in any case ("DINO_LOSS" counts as dino_loss)."""
    text = path.read_text()
    found = []
    for name in names:
        for match in re.finditer(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text,
                                 re.IGNORECASE):
            found.append(f"{path.name}:{text[:match.start()].count(chr(10)) + 1}: {name}")
    return found


def test_the_config_layer_names_no_loss_or_trunk(tmp_path):
    names = sorted(set(LOSS_REGISTRY) | set(MODEL_TRUNKS.names()))
    assert {"dino_loss", "swav_loss", "regnet", "vision_transformer"} <= set(names)
    found = [hit for path in config_sources() for hit in component_names_in(path, names)]
    assert not found, found
    sample = tmp_path / "sample.py"  # the search finds a name in a key path, in any case
    sample.write_text('KEYS = {"config.LOSS.swav_loss.x": 1}\n# the XCIT trunk\nRESNETS = 2\n')
    assert component_names_in(sample, names) == ["sample.py:1: swav_loss", "sample.py:2: xcit"]


def test_components_declare_their_own_vissl_keys():
    """The key rules that name a component come from the component's module."""
    from ssl_engine.config.ignored_keys import drop_ignored_keys
    from ssl_engine.config.unsupported import unsupported_keys, unsupported_names
    from ssl_engine.config.validate import validate_config
    from ssl_engine.config.compose import load_defaults

    assert "config.LOSS.dino_loss.normalize_last_layer" in key_rules.ignored_keys()
    assert "config.MODEL.TRUNK.CONVIT.QK_SCALE" in key_rules.ignored_keys()
    assert "config.LOSS.cross_entropy_multiple_output_single_target.reduction" in \
        unsupported_keys()
    assert "CrossEntropyLoss" in unsupported_names()["config.LOSS.name"]
    assert "config.MODEL.TRUNK.BEIT.INIT_VALUES" in key_rules.number_or_false_keys()
    schema = load_defaults()
    schema.pop("defaults", None)
    cfg = {"config": {"LOSS": {"dino_loss": {"normalize_last_layer": True}},
                      "MODEL": {"TRUNK": {"XCIT": {"ETA": 1e-5}}}}}
    assert drop_ignored_keys(cfg, schema) == ["config.LOSS.dino_loss.normalize_last_layer"]
    validate_config(cfg, schema)  # ETA: a number where the default is false
    cfg["config"]["MODEL"]["TRUNK"]["XCIT"]["ETA"] = "small"
    with pytest.raises(ConfigError, match="XCIT.ETA"):
        validate_config(cfg, schema)
    cfg = {"config": {"LOSS": {"name": "CrossEntropyLoss"}}}
    with pytest.raises(ConfigError, match="use cross_entropy_multiple_output_single_target"):
        validate_config(cfg, schema)


def test_composing_before_the_components_are_imported_is_refused():
    """A config composed before the losses and trunks register would miss their derived
    settings and key rules: refused, naming the imports (a fresh process imports config only)."""
    code = ("from ssl_engine.config import load_config\n"
            "load_config(['config=quickstart/simclr_digits'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode != 0
    assert "import ssl_engine.losses and ssl_engine.models" in done.stderr.splitlines()[-1]


def imported_modules(path: Path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside ssl_engine.config
                base = ".".join(["ssl_engine", "config"][:3 - node.level] + [base]).strip(".")
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_the_config_layer_imports_no_loss_or_model(tmp_path):
    wrong = sorted(f"{path.name} imports {module}" for path in config_sources()
                   for module in imported_modules(path)
                   if module.startswith(("ssl_engine.losses", "ssl_engine.models")))
    assert not wrong, wrong
    source = tmp_path / "sample.py"  # the reader sees the imports it must refuse
    source.write_text("import os\ndef f():\n"
                      "    from ssl_engine.models.trunks.regnet import clear_parameters\n")
    assert "ssl_engine.models.trunks.regnet" in imported_modules(source)


class DoublesTheBatch(SSLLoss):
    """A user's loss whose ``doubled_batch`` is derived from the training batch size."""

    @classmethod
    def derive_config(cls, cfg) -> None:
        super().derive_config(cfg)
        settings = cfg.LOSS.setdefault(cfg.LOSS.name, {})
        settings["doubled_batch"] = 2 * cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA

    def forward(self, output, target=None):
        raise NotImplementedError


def test_a_user_loss_derives_its_own_key(monkeypatch):
    monkeypatch.setitem(LOSS_REGISTRY, "doubles_the_batch_loss", DoublesTheBatch)
    _, cfg = compose_config(["config=test/quick_simclr_synthetic",
                             "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=6",
                             "config.LOSS.name=doubles_the_batch_loss"])
    assert "doubles_the_batch_loss" not in cfg.LOSS
    derive_settings(cfg)
    assert cfg.LOSS.doubles_the_batch_loss.doubled_batch == 12
    # a loss that declares nothing derives nothing
    monkeypatch.setitem(LOSS_REGISTRY, "doubles_the_batch_loss", SSLLoss)
    _, cfg = compose_config(["config=test/quick_simclr_synthetic",
                             "config.LOSS.name=doubles_the_batch_loss"])
    assert "doubles_the_batch_loss" not in derive_settings(cfg).LOSS


SAMPLE = sorted(f"{path.parent.name}/{path.stem}" for folder in ("quickstart", "test")
                for path in (REPO / "configs/config" / folder).glob("*.yaml"))
# derived keys, set to a value no derivation gives, so that a lost derivation shows
WRONG = {
    "crops": 99, "output_dim": 7, "ibot": {"num_global_crops": 9, "num_local_crops": 9,
                                           "out_dim": 7, "patch_out_dim": 7, "num_epochs": 999},
    "patch_size": 99, "swav": ([7], 3),
}


def last_head(cfg):
    return cfg.MODEL.HEAD.PARAMS[-1][1]


def first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def poisoned(name):
    """(overrides that set the sample's derived keys wrong, its loss name)."""
    loss = compose_config([f"config={name}", "config.MACHINE.DEVICE=cpu"])[1].LOSS.name
    crops_key = getattr(LOSS_REGISTRY[loss], "crops_key", None)
    overrides = [f"config.LOSS.{loss}.{crops_key}={WRONG['crops']}"] if crops_key else []
    if loss in ("dino_loss", "dinov3_loss", "msn_loss", "capi_loss"):
        overrides.append(f"config.LOSS.{loss}.output_dim={WRONG['output_dim']}")
    if loss == "ibot_loss":
        overrides += [f"config.LOSS.ibot_loss.{key}={value}"
                      for key, value in WRONG["ibot"].items()]
    if loss in ("mae_loss", "aim_loss", "ijepa_loss"):
        overrides.append(f"config.LOSS.{loss}.patch_size={WRONG['patch_size']}")
    if loss == "swav_loss":
        overrides += [f"config.LOSS.swav_loss.num_prototypes={WRONG['swav'][0]}",
                      f"config.LOSS.swav_loss.embedding_dim={WRONG['swav'][1]}"]
    return overrides, loss


@pytest.mark.parametrize("name", SAMPLE)
def test_shipped_samples_get_every_derived_setting(name):
    overrides, loss = poisoned(name)
    _, cfg = compose_config([f"config={name}", "config.MACHINE.DEVICE=cpu", *overrides])
    derive_settings(cfg)
    settings = cfg.LOSS[loss]
    crops_key = getattr(LOSS_REGISTRY[loss], "crops_key", None)
    checked = 0
    if crops_key:
        crops = crops_per_sample(cfg.DATA.TRAIN.TRANSFORMS)
        assert crops > 1 and settings[crops_key] == crops
        checked += 1
    if loss in ("dino_loss", "dinov3_loss"):
        assert settings.output_dim == first(last_head(cfg)["num_clusters"])
        checked += 1
    if loss == "msn_loss":
        assert settings.output_dim == first(last_head(cfg)["num_prototypes"])
        masking = cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING
        assert masking.NAME == "msn" and masking.PARAMS["seed"] == cfg.SEED_VALUE
        checked += 2
    if loss == "capi_loss":
        assert settings.output_dim == last_head(cfg)["num_clusters"]
        checked += 1
    if loss == "ibot_loss":
        head, spec = last_head(cfg), cfg.DATA.TRAIN.TRANSFORMS
        counts = next(t["num_crops"] for t in spec if t["name"] == "ImgPilToMultiCrop")
        assert (settings.num_global_crops, settings.num_local_crops) == (counts[0],
                                                                         sum(counts[1:]))
        assert settings.out_dim == head["out_dim"] and settings.num_epochs == \
            cfg.OPTIMIZER.num_epochs
        assert settings.patch_out_dim == head.get("patch_out_dim", head["out_dim"])
        checked += 3
    if loss in ("mae_loss", "aim_loss", "ijepa_loss"):
        assert settings.patch_size == cfg.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE != 99
        checked += 1
    if loss == "swav_loss":
        head = last_head(cfg)
        if settings.queue.queue_length:  # the loss sizes its queue with its own settings
            assert (list(settings.num_prototypes), settings.embedding_dim) == WRONG["swav"]
        else:
            assert list(settings.num_prototypes) == list(head["num_clusters"])
            assert settings.embedding_dim == head["dims"][-1]
        checked += 1
    if LOSS_REGISTRY[loss].sample_index_targets if hasattr(LOSS_REGISTRY[loss],
                                                            "sample_index_targets") else False:
        assert cfg.DATA.TRAIN.LABEL_TYPE == "sample_index"
        _, wrong = compose_config([f"config={name}", "config.MACHINE.DEVICE=cpu",
                                   "config.DATA.TRAIN.LABEL_TYPE=standard"])
        with pytest.raises(ConfigError, match="LABEL_TYPE=sample_index"):
            derive_settings(wrong)
        checked += 1
    derives = {"dino_loss", "msn_loss", "ibot_loss", "mae_loss", "swav_loss",
               "swav_momentum_loss", "swav_distillation_loss", "deepclusterv2_loss",
               "multicrop_simclr_info_nce_loss", "nce_loss_with_memory",
               "mmcr_loss", "lejepa_loss", "pmsn_loss",  # their views or crops per sample
               "capi_loss", "aim_loss", "ijepa_loss", "data2vec_loss", "dinov3_loss"}
    assert (checked > 0) == (loss in derives), (loss, checked)


def test_a_regnet_preset_clears_the_parameters_beside_it_under_its_fsdp_name_too():
    for trunk in ("regnet", "regnet_fsdp"):
        _, cfg = compose_config(["config=test/quick_simclr_synthetic",
                                 f"config.MODEL.TRUNK.NAME={trunk}",
                                 "config.MODEL.TRUNK.REGNET.name=regnet_y_400mf",
                                 "config.MODEL.TRUNK.REGNET.depth=99"])
        assert cfg.MODEL.TRUNK.REGNET.depth == 99
        derive_settings(cfg)
        assert cfg.MODEL.TRUNK.REGNET.name == "regnet_y_400mf"
        assert cfg.MODEL.TRUNK.REGNET.depth is None, trunk
