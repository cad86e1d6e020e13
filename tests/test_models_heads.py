"""The mlp head against a hand-built nn.Sequential with the same weights."""
import pytest
import torch
from torch import nn

from ssl_engine.models import MODEL_HEADS
from ssl_engine.models.heads.mlp import MLP


def copy_weights(source: nn.Module, target: nn.Sequential) -> None:
    """Copy parameters and buffers in order (the layouts are the same by construction)."""
    src = list(source.state_dict().values())
    dst = list(target.state_dict().keys())
    assert len(src) == len(dst)
    target.load_state_dict(dict(zip(dst, src)))


def randomize_bn(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("train", [True, False])
def test_mlp_with_bn_and_relu_matches_sequential(train):
    torch.manual_seed(0)
    head = MLP(dims=[12, 16, 8, 4], use_bn=True, use_relu=True)
    reference = nn.Sequential(
        nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(),
        nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Linear(8, 4),
    )
    randomize_bn(head)
    copy_weights(head, reference)
    head.train(train)
    reference.train(train)
    x = torch.randn(6, 3, 2, 2)  # flattened to 12 features
    torch.testing.assert_close(head(x), reference(x.flatten(1)))


def test_mlp_last_layer_relu_bn_when_not_skipped():
    torch.manual_seed(0)
    head = MLP(dims=[5, 3], use_bn=True, use_relu=True, skip_last_layer_relu_bn=False).eval()
    reference = nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3), nn.ReLU()).eval()
    randomize_bn(head)
    copy_weights(head, reference)
    x = torch.randn(7, 5)
    out = head(x)
    torch.testing.assert_close(out, reference(x))
    assert torch.all(out >= 0)


def test_mlp_last_layer_bn_without_relu():
    torch.manual_seed(0)
    head = MLP(dims=[5, 4, 3], use_bn=True, use_relu=True, last_layer_bn=True).eval()
    reference = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3),
                              nn.BatchNorm1d(3)).eval()
    randomize_bn(head)
    copy_weights(head, reference)
    x = torch.randn(7, 5)
    out = head(x)
    torch.testing.assert_close(out, reference(x))
    assert torch.any(out < 0)


def test_mlp_defaults_are_plain_linear_layers():
    torch.manual_seed(0)
    head = MLP(dims=[4, 6, 2])
    assert [type(m) for m in head.clf] == [nn.Linear, nn.Linear]
    x = torch.randn(3, 4)
    first, second = head.clf
    expected = (x @ first.weight.T + first.bias) @ second.weight.T + second.bias
    torch.testing.assert_close(head(x), expected)


def test_mlp_is_registered():
    assert MODEL_HEADS.get("mlp") is MLP


def test_mlp_errors():
    with pytest.raises(ValueError, match="at least 2 sizes"):
        MLP(dims=[4])
    with pytest.raises(ValueError, match="expects 4 input features"):
        MLP(dims=[4, 2])(torch.randn(2, 5))


def test_head_batch_norm_settings_of_the_config_reach_every_head():
    """MODEL.HEAD.BATCHNORM_MOMENTUM / EPS (VISSL's keys) set the heads' batch norms: the running
    mean moves by the configured momentum, and eps is the configured one."""
    import copy
    from pathlib import Path

    import yaml

    from ssl_engine.config.attr_dict import AttrDict
    from ssl_engine.models import build_model

    with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
        cfg = AttrDict(copy.deepcopy(yaml.safe_load(f)["config"]["MODEL"]))
    cfg.TRUNK.RESNETS.update(DEPTH=18, WIDTH_MULTIPLIER=0.125)
    cfg.HEAD.PARAMS = [["mlp", {"dims": [64, 32, 8], "use_bn": True, "use_relu": True}],
                       ["eval_mlp", {"in_channels": 8, "dims": [8, 4]}]]
    cfg.HEAD.BATCHNORM_MOMENTUM, cfg.HEAD.BATCHNORM_EPS = 0.001, 1e-3
    heads = build_model(cfg).heads
    norms = [m for m in heads.modules() if isinstance(m, nn.BatchNorm1d)]
    assert len(norms) == 2 and all((m.momentum, m.eps) == (0.001, 1e-3) for m in norms)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    linear, bn = heads[0].clf[0], heads[0].clf[1]
    with torch.no_grad():
        expected = 0.001 * linear(x).mean(0)  # from running_mean 0
        heads[0].train()(x)
    torch.testing.assert_close(bn.running_mean, expected)
    cfg.HEAD.BATCHNORM_MOMENTUM = 0.0
    with pytest.raises(ValueError, match="BATCHNORM_MOMENTUM=0.0 in"):
        build_model(cfg)


def test_siamese_concat_view_puts_the_towers_of_each_sample_side_by_side():
    from ssl_engine.data.collators.siamese import siamese_collator

    head = MODEL_HEADS.get("siamese_concat_view")(num_towers=3)
    # 2 samples of 3 tiles [C=1, 1, 1] whose value encodes (sample, tile)
    samples = [{"data": [torch.tensor([10.0 * s + t for t in range(3)]).reshape(3, 1, 1, 1)],
                "label": [s], "data_idx": s, "data_valid": True} for s in range(2)]
    batch = siamese_collator(samples)
    features = torch.cat([batch["input"].flatten(1), -batch["input"].flatten(1)], 1)  # [6, 2]
    out = head(features)
    assert torch.equal(out, torch.tensor([[0.0, -0.0, 1, -1, 2, -2], [10, -10, 11, -11, 12, -12]]))
    with pytest.raises(ValueError, match="not a multiple of num_towers=4"):
        MODEL_HEADS.get("siamese_concat_view")(num_towers=4)(features)


def test_swav_head_with_weight_norm_prototypes_and_gelu():
    torch.manual_seed(0)
    head = MODEL_HEADS.get("swav_head")(dims=[6, 8, 4], num_clusters=[5], return_embeddings=False,
                                    activation_name="GELU", use_weight_norm_prototypes=True)
    names = {name for name, _ in head.named_parameters()}
    assert {"prototypes0.weight_g", "prototypes0.weight_v"} <= names
    assert isinstance(head.projection_head[1], nn.GELU)
    with torch.no_grad():
        head.prototypes0.weight_g.mul_(3.0)
    x = torch.randn(7, 6)
    embedding = torch.nn.functional.normalize(head.projection_head(x), dim=1)
    v = head.prototypes0.weight_v
    (scores,) = head(x)
    torch.testing.assert_close(scores, embedding @ (3.0 * v / v.norm(dim=1, keepdim=True)).t())
    head.normalize_prototypes()  # weight-normalised prototypes keep their trained lengths
    torch.testing.assert_close(head.prototypes0.weight.norm(dim=1), torch.full((5,), 3.0))
    with pytest.raises(ValueError, match="activation_name must be one of"):
        MODEL_HEADS.get("swav_head")(dims=[6, 4], num_clusters=[5], activation_name="Tanh")


def test_mlp_without_biases():
    head = MODEL_HEADS.get("mlp")(dims=[6, 8, 4], use_bn=True, use_relu=True, use_bias=False)
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 and all(layer.bias is None for layer in linears)
    x = torch.randn(5, 6)
    torch.testing.assert_close(head(x), linears[1](torch.relu(head.clf[1](linears[0](x)))))


def test_identity_head_returns_the_trunk_output_unchanged():
    features = torch.randn(3, 7, 2, 2)
    head = MODEL_HEADS.get("identity")()
    assert head(features) is features and not list(head.parameters())


def test_head_entry_elements_after_the_params_are_ignored_with_a_warning(caplog):
    # VISSL's PIRL w2/w4 configs write ["mlp", {"dims": [...]}, "use_relu": True]: YAML reads a
    # third element {"use_relu": True}, which VISSL never read; the head is the two-element one
    from ssl_engine.models.base_ssl_model import build_head

    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="ssl_engine.models.base_ssl_model"):
        head = build_head(1, ["mlp", {"dims": [6, 5, 3]}, {"use_relu": True}])
    torch.manual_seed(0)
    plain = build_head(1, ["mlp", {"dims": [6, 5, 3]}])
    assert str(head) == str(plain)
    x = torch.randn(4, 6)
    torch.testing.assert_close(head(x), plain(x))
    assert "MODEL.HEAD.PARAMS[1] ('mlp'): [{'use_relu': True}] after the params ignored" \
        in caplog.text
    with pytest.raises(ValueError, match=r"must be \[head_name, \{params\}\]"):
        build_head(0, ["mlp", "dims"])
    with pytest.raises(ValueError, match=r"must be \[head_name, \{params\}\]"):
        build_head(0, ["mlp"])
